"""What is on this machine: `pardec list`, `show` and `rm` without the printing.

Two kinds of models live here: those pardec pulled (files in the Hugging Face cache, a
record in ``pardec_home()/pulled``) and those in pardec's own store (GGUF imports and
the embedded model, ``models_dir()/<name>``). Neither torch nor transformers is needed:
sizes and parameter counts come from file sizes and safetensors headers.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pardec_cli.errors import ModelNotFoundError, PardecError
from pardec_cli.home import models_dir
from pardec_cli.store import hub, records
from pardec_cli.store.catalog import CatalogEntry, entry_for_repo, lookup_alias, suggest_aliases
from pardec_cli.store.embedded import EMBEDDED_ALIAS, EMBEDDED_REPO
from pardec_cli.store.heads import model_key, trained_accelerators
from pardec_cli.store.layout import (
    MARKER_NAME,
    clean_stale_scratch,
    damaged_files,
    installed_models,
    is_complete,
    read_marker,
    scratch_prefix,
)
from pardec_cli.store.records import PullRecord, RepoRecord

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}


# --------------------------------------------------------------------- list


@dataclass
class ModelSummary:
    """One model on this machine (a row of `pardec list`)."""

    name: str
    source: str  # "hub" (pulled), "gguf" (imported), "embedded"
    path: Path
    size: int
    alias: str | None = None
    repo: str | None = None
    revision: str | None = None
    commit: str | None = None
    accelerators: list[dict[str, Any]] = field(default_factory=list)
    last_used: str | None = None
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alias": self.alias,
            "source": self.source,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "path": str(self.path),
            "size_bytes": self.size,
            "accelerators": self.accelerators,
            "last_used": self.last_used,
            "complete": self.complete,
        }


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _accelerator_dict(rec: RepoRecord) -> dict[str, Any]:
    from pardec_cli.store.catalog import ACCELERATOR_METHODS

    return {
        "name": rec.name or rec.repo,
        "kind": rec.kind,
        "method": ACCELERATOR_METHODS.get(rec.kind, rec.kind),
        "repo": rec.repo,
        "revision": rec.revision,
        "commit": rec.commit,
        "status": rec.status if rec.present() else "missing",
        "detail": rec.detail if rec.present() else "its files are no longer in the cache",
        "size_bytes": rec.size,
        "path": str(rec.snapshot),
    }


def _pulled_summary(record: PullRecord) -> ModelSummary:
    target = record.target
    return ModelSummary(
        name=record.name,
        alias=record.alias,
        source="hub",
        repo=target.repo,
        revision=target.revision,
        commit=target.commit,
        path=target.snapshot,
        size=target.size,
        accelerators=[_accelerator_dict(a) for a in record.accelerators] + trained_accelerators(model_key(record.name)),
        last_used=records.last_used(record.name, record.alias or "", target.repo),
        complete=target.present(),
    )


def _store_summary(name: str) -> ModelSummary:
    path = models_dir() / name
    marker = read_marker(path)
    repo = marker.get("source_repo") or None
    embedded = name == EMBEDDED_ALIAS and repo == EMBEDDED_REPO
    return ModelSummary(
        name=name,
        alias=EMBEDDED_ALIAS if embedded else None,
        source="embedded" if embedded else str(marker.get("source") or "store"),
        repo=repo,
        path=path,
        size=_dir_size(path),
        accelerators=trained_accelerators(model_key(name)),
        last_used=records.last_used(name),
        complete=not damaged_files(path),
    )


def list_models() -> list[ModelSummary]:
    """Every model on this machine: pulled ones, then pardec's store, each by name."""
    clean_stale_scratch(models_dir())  # what a killed import or rm left behind
    pulled = [_pulled_summary(r) for r in records.all_records()]
    stored = [_store_summary(n) for n in installed_models()]
    return sorted(pulled + stored, key=lambda m: (m.name.lower(), m.source))


# ------------------------------------------------------------ the catalog


@dataclass
class CatalogRow:
    """One catalog alias as `pardec list --available` shows it.

    `installed` is how the model is here ("pulled", "embedded", "imported", "in the
    Hugging Face cache") or None; `download_bytes` the catalog's estimate of what a pull
    of the model alone fetches (None when it gives no parameter count); `size_bytes`
    what the installed copy takes on disk.
    """

    entry: CatalogEntry
    installed: str | None
    size_bytes: int | None
    accelerators: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        return {
            "alias": e.alias, "repo": e.repo, "revision": e.revision, "family": e.family, "params": e.params or None,
            "parameters": e.parameters, "download_bytes_estimate": e.approx_download_bytes,
            "description": e.description, "installed": self.installed, "size_bytes": self.size_bytes,
            "accelerators": self.accelerators,
        }  # fmt: skip


_SOURCE_WORDS = {"hub": "pulled", "hf-cache": "in the Hugging Face cache", "gguf": "imported", "embedded": "embedded"}


def catalog_rows() -> list[CatalogRow]:
    """Every catalog alias with what it brings (drafters, heads) and what of it is here."""
    from pardec_cli.store.catalog import load_catalog
    from pardec_cli.store.resolve import cached_snapshot, is_usable

    here: dict[str, ModelSummary] = {}
    for model in list_models():
        for key in (model.alias, model.name, model.repo):
            if key:
                here.setdefault(key.lower(), model)
    catalog = load_catalog()

    def status(alias: str, repo: str, revision: str | None) -> tuple[str | None, int | None]:
        found = here.get(alias) or here.get(repo.lower())
        if found is not None:
            return _SOURCE_WORDS.get(found.source, found.source), found.size
        cached = cached_snapshot(repo, revision)
        if cached is not None and is_usable(cached, require_weights=True):
            return _SOURCE_WORDS["hf-cache"], sum(f["size_bytes"] for f in _files(cached))
        return None, None

    rows = []
    for alias, entry in catalog.items():
        installed, size = status(alias, entry.repo, entry.revision)
        accelerators = []
        for acc in entry.accelerators():
            other = catalog.get(acc.ref.lower())
            repo = other.repo if other else acc.ref
            acc_installed, _ = status(acc.ref.lower(), repo, other.revision if other else None)
            accelerators.append({"name": acc.ref, "kind": acc.kind, "method": acc.method, "repo": repo,
                                 "installed": acc_installed is not None})
        rows.append(CatalogRow(entry, installed, size, accelerators))
    return rows


def describe_catalog_entry(spec: str) -> dict[str, Any] | None:
    """A catalog alias that is not installed, as `pardec show` describes it; None when
    `spec` is no alias."""
    entry = lookup_alias(spec)
    if entry is None:
        return None
    row = next(r for r in catalog_rows() if r.entry.alias == entry.alias)
    info = row.to_dict()
    info["chat_template_notes"] = entry.chat_template
    info["notes"] = entry.notes
    return info


# --------------------------------------------------------------------- show


def safetensors_header(file: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (empty when unreadable)."""
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 1024 * 1024:
                return {}
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return {}
    return header if isinstance(header, dict) else {}


def count_parameters(path: Path, config: dict[str, Any]) -> tuple[int | None, bool]:
    """(parameters, exact): from safetensors headers, else estimated from .bin sizes."""
    total, seen = 0, False
    for file in sorted(path.glob("*.safetensors")):
        for name, info in safetensors_header(file).items():
            if name != "__metadata__" and isinstance(info, dict):
                count = 1
                for dim in info.get("shape", []):
                    count *= int(dim)
                total += count
                seen = True
    if seen:
        return total, True
    pickles = [p for p in path.glob("*.bin") if "training_args" not in p.name]
    if pickles:
        dtype = checkpoint_dtype(config) or "float16"
        return sum(p.stat().st_size for p in pickles) // _DTYPE_BYTES.get(dtype, 2), False
    return None, False


def checkpoint_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a model's config.json says its weights are stored in ("bfloat16", ...;
    "torch_dtype" before transformers 5, "dtype" since), None where it says none."""
    value = config.get("torch_dtype") or config.get("dtype")
    return str(value) if value else None


def has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))


def config_summary(path: Path) -> dict[str, Any]:
    """Architecture, size and shape of the model in `path`, from its files alone."""
    try:
        config = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    params, exact = count_parameters(path, config)
    architectures = config.get("architectures") or []

    def first(*keys: str) -> Any:
        return next((text[k] for k in keys if text.get(k) is not None), None)

    return {
        "architecture": architectures[0] if architectures else None,
        "model_type": config.get("model_type"),
        "parameters": params,
        "parameters_exact": exact,
        "layers": first("num_hidden_layers", "n_layer", "num_layers"),
        "hidden_size": first("hidden_size", "n_embd", "d_model"),
        "context_length": first("max_position_embeddings", "n_positions", "max_sequence_length"),
        "vocab_size": first("vocab_size"),
        "activation": first("hidden_act", "hidden_activation"),
        "dtype": checkpoint_dtype(config) or text.get("torch_dtype"),
        "chat_template": has_chat_template(path),
    }


def _files(path: Path) -> list[dict[str, Any]]:
    if not path.is_dir():
        return []
    return [
        {"name": str(p.relative_to(path)), "size_bytes": p.stat().st_size}
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != MARKER_NAME
    ]


def _catalog_entry(*names: str | None) -> CatalogEntry | None:
    for name in names:
        if name:
            entry = lookup_alias(name) or (entry_for_repo(name) if "/" in name else None)
            if entry is not None:
                return entry
    return None


def _catalog_accelerators(entry: CatalogEntry | None, pulled: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The catalog's accelerators that were not pulled, with where they stand."""
    if entry is None:
        return []
    from pardec_cli.store.resolve import cached_snapshot

    have = {(a["repo"] or "").lower() for a in pulled} | {(a["name"] or "").lower() for a in pulled}
    rows = []
    for acc in entry.accelerators():
        other = lookup_alias(acc.ref)
        repo = other.repo if other else acc.ref
        if acc.ref.lower() in have or repo.lower() in have:
            continue
        cached = cached_snapshot(repo, other.revision if other else None)
        rows.append({
            "name": acc.ref, "kind": acc.kind, "method": acc.method, "repo": repo,
            "status": "in the Hugging Face cache, not checked" if cached else "not pulled",
            "detail": "", "size_bytes": None, "path": str(cached) if cached else None,
        })  # fmt: skip
    return rows


def show_model(spec: str) -> dict[str, Any]:
    """Everything about one local model; `ModelNotFoundError` when it is not here."""
    record = records.find(spec)
    store = models_dir() / spec.strip()
    if record is not None:
        summary = _pulled_summary(record)
    elif "/" not in spec and not spec.startswith(".") and is_complete(store):
        summary = _store_summary(spec.strip())
    else:
        summary = _unpulled(spec)
    info = summary.to_dict()
    entry = _catalog_entry(summary.alias, summary.name, summary.repo)
    info["accelerators"] = summary.accelerators + _catalog_accelerators(entry, summary.accelerators)
    info["config"] = config_summary(summary.path)
    info["files"] = _files(summary.path)
    info["chat_template_notes"] = entry.chat_template if entry else ""
    info["notes"] = entry.notes if entry else ""
    if summary.source in ("gguf", "embedded"):
        info["marker"] = read_marker(summary.path)
    return info


def _unpulled(spec: str) -> ModelSummary:
    """A model that is on disk but not pulled by pardec: a directory or a cache entry."""
    from pardec_cli.store.resolve import cached_snapshot, is_usable, looks_like_hub_id

    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        trained = trained_accelerators(model_key(spec, source="local", path=path))
        return ModelSummary(name=spec, source="local", path=path.resolve(), size=_dir_size(path), accelerators=trained)
    entry = lookup_alias(spec)
    repo = entry.repo if entry else spec.strip() if looks_like_hub_id(spec.strip()) else None
    if repo is not None:
        revision = entry.revision if entry else None
        cached = cached_snapshot(repo, revision)
        if cached is not None and is_usable(cached, require_weights=True):
            size = sum(f["size_bytes"] for f in _files(cached))
            return ModelSummary(
                name=entry.alias if entry else repo, alias=entry.alias if entry else None,
                source="hf-cache", repo=repo, revision=revision or "main", commit=cached.name,
                path=cached, size=size, last_used=records.last_used(spec, repo),
            )  # fmt: skip
        raise ModelNotFoundError(
            f"{spec} is not on this machine", hint=f"pardec pull {spec}"
        )
    raise _unknown_local(spec)


def _unknown_local(spec: str) -> ModelNotFoundError:
    known = [m.name for m in list_models()]
    close = difflib.get_close_matches(spec, known, n=3) or suggest_aliases(spec)
    hint = ("did you mean: " + ", ".join(close) + "?") if close else \
        "`pardec list` shows the models here, `pardec list --available` those that can be pulled"
    return ModelNotFoundError(f"unknown model {spec!r}", hint=hint)


# ----------------------------------------------------------------------- rm


@dataclass
class Removal:
    """One thing `pardec rm` will remove: what it is, about how big, and how."""

    name: str
    description: str
    size: int
    run: Callable[[], int]
    kept: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # filled by `run`: what it refused to touch


def _held_by_others(name: str) -> tuple[set[tuple[str, str, str, str]], dict[str, list[str]]]:
    """Files other records hold, and for each (cache, repo) the record names holding it."""
    held: set[tuple[str, str, str, str]] = set()
    users: dict[str, list[str]] = {}
    for record in records.all_records():
        if record.name.lower() == name.lower():
            continue
        for rec in record.repos():
            held.update((rec.cache, rec.repo.lower(), rec.commit, f) for f in rec.files)
            users.setdefault(f"{rec.cache}|{rec.repo.lower()}|{rec.commit}", []).append(record.name)
    return held, users


def _pulled_removal(record: PullRecord, hf_cache: bool) -> Removal:
    from pardec_cli.store.pull import release

    held, users = _held_by_others(record.name)
    kept = []
    size = 0
    for rec in record.repos():
        who = users.get(f"{rec.cache}|{rec.repo.lower()}|{rec.commit}")
        if who:
            kept.append(f"{rec.name or rec.repo} (also used by {', '.join(who)})")
        size += sum(s for f, s in rec.files.items() if (rec.cache, rec.repo.lower(), rec.commit, f) not in held)

    def run() -> int:
        records.delete(record)  # first: nothing points at files about to go
        records.forget(record.name, record.alias or "", record.target.repo)
        freed = sum(release(rec, held, removal.problems) for rec in record.repos())
        if hf_cache:
            freed += hub.remove_repo(record.target.repo, Path(record.target.cache))
        return freed

    accelerators = [a.name or a.repo for a in record.accelerators]
    what = f"{record.name} ({record.target.repo} @ {record.target.revision}, pulled)"
    if accelerators:
        what += " with " + ", ".join(accelerators)
    if hf_cache:
        what += f", and its whole cache folder {hub.repo_dir(record.target.repo, Path(record.target.cache))}"
    removal = Removal(record.name, what, size, run, kept)
    return removal


def _store_removal(name: str) -> Removal:
    path = models_dir() / name
    marker = read_marker(path)
    kind = "the embedded model, converted again on next use" if name == EMBEDDED_ALIAS else f"{marker.get('source', 'store')} import"
    # A store entry that is a link: the link goes, the folder it points to stays (and
    # its bytes are not freed).
    linked = path.is_symlink()

    def run() -> int:
        size = 0 if linked else _dir_size(path)
        trash = Path(tempfile.mkdtemp(prefix=scratch_prefix(name, "rm"), dir=path.parent))
        os.replace(path, trash / name)  # atomic: the model is gone at once, not half
        shutil.rmtree(trash, ignore_errors=True)
        records.forget(name)
        return size

    if linked:
        return Removal(name, f"{name} (a link to {path.resolve()}; only the link is removed)", 0, run)
    return Removal(name, f"{name} ({kind}, {path})", _dir_size(path), run)


def _broken_record_removal(spec: str, file: Path) -> Removal:
    """A pull record that is not valid: only the record goes (its file list cannot be trusted)."""

    def run() -> int:
        file.unlink(missing_ok=True)
        records.forget(spec)
        return 0

    what = f"{spec} (a broken pull record {file}; the files it names are not touched)"
    return Removal(spec, what, 0, run)


def plan_removal(spec: str, *, hf_cache: bool = False) -> list[Removal]:
    """What `pardec rm SPEC` removes; errors for what pardec does not own."""
    from pardec_cli.store.resolve import looks_like_hub_id

    spec = spec.strip()
    plans = []
    record = records.find(spec)
    if record is not None:
        plans.append(_pulled_removal(record, hf_cache))
    if spec and "/" not in spec and not spec.startswith(".") and (models_dir() / spec).is_dir():
        if is_complete(models_dir() / spec):
            plans.append(_store_removal(spec))
    broken = records.broken_record_file(spec) if record is None else None
    if broken is not None:
        plans.append(_broken_record_removal(spec, broken))
    if plans:
        return plans
    entry = lookup_alias(spec)
    repo = entry.repo if entry else spec if looks_like_hub_id(spec) else None
    if repo is not None and hub.repo_dir(repo).is_dir():
        if not hf_cache:
            raise PardecError(
                f"{spec} was not pulled by pardec: its files in {hub.repo_dir(repo)} "
                "belong to whatever downloaded them",
                hint=f"pardec rm --hf-cache {spec} deletes that Hugging Face cache entry anyway",
            )
        folder = hub.repo_dir(repo)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
        return [Removal(spec, f"{spec} (Hugging Face cache entry {folder}, every revision)", size,
                        lambda: hub.remove_repo(repo))]  # fmt: skip
    if repo is not None:
        raise ModelNotFoundError(f"{spec} is not on this machine: nothing to remove")
    raise _unknown_local(spec)
