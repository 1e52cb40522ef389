"""From what the user typed (``-m ...``) to a model directory on disk.

`resolve_model` tries, in order:

1. nothing -> the embedded model ("embedded"); the embedded alias ``smollm2-135m``
   too, unless ``pardec pull smollm2-135m`` fetched the original weights;
2. an existing directory with a config.json -> used in place ("local");
3. a complete model in pardec's store, ``models_dir()/<name>`` ("store");
4. a model pardec pulled (by alias, name or repo), at the pulled revision ("hf-cache");
5. a catalog alias -> its Hub repo, then as 6.;
6. a Hub id ``org/name`` -> the local Hugging Face cache ("hf-cache"), else a pull
   without accelerators ("hub") unless offline.

Steps 1-4 and the cache lookups never touch the network, so pulled models resolve
offline. Every failure is a one-line `PardecError` (usually `ModelNotFoundError`) with
a hint. huggingface_hub is imported only to download.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from pardec_cli.errors import ModelNotFoundError
from pardec_cli.home import models_dir
from pardec_cli.store import hub, records
from pardec_cli.store.catalog import entry_for_repo, lookup_alias, suggest_aliases
from pardec_cli.store.embedded import EMBEDDED_ALIAS, EMBEDDED_REPO, ensure_embedded_model
from pardec_cli.store.layout import installed_models, is_complete, read_marker

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".pth")

__all__ = [
    "ResolvedModel", "entry_for_repo", "env_offline", "fetch_snapshot", "hub_cache_dir",
    "cached_snapshot", "is_usable", "looks_like_hub_id", "resolve_model", "unknown_model_error",
]  # fmt: skip

SOURCES: tuple[str, ...] = ("embedded", "store", "local", "hf-cache", "hub")
_HUB_ID_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9_.-]+")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class ResolvedModel:
    """A model found on disk.

    `name` is what identifies it to the user (the alias, store name, Hub id or the
    directory as given); `source` is one of `SOURCES`; `repo` is the Hub id it came
    from when known (lets callers find catalog drafters and heads).
    """

    name: str
    path: Path
    source: str
    repo: str | None = None


# ----------------------------------------------------------------- environment


def env_offline() -> bool:
    """Whether the environment asks for offline mode (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUE
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment says now (HF_HUB_CACHE, HF_HOME).

    Read at call time, not at huggingface_hub's import time, so a changed environment
    (tests, `--offline` wrappers) is honoured.
    """
    return hub.cache_root()


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` with Hub-legal characters (no local path syntax)."""
    return bool(_HUB_ID_RE.fullmatch(spec)) and ".." not in spec and not spec.endswith(".")


# ------------------------------------------------------------------- Hub access


def _has_weights(path: Path) -> bool:
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file())


def _shards_complete(path: Path) -> bool:
    """Every shard that a ``*.index.json`` in `path` names is there."""
    for index in path.glob("*.index.json"):
        try:
            weight_map = json.loads(index.read_text("utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            return False
        if not all((path / str(shard)).is_file() for shard in set(weight_map.values())):
            return False
    return True


def is_usable(path: Path, require_weights: bool = True) -> bool:
    """config.json and, when `require_weights`, weights with every indexed shard."""
    if not (path / "config.json").is_file():
        return False
    return _has_weights(path) and _shards_complete(path) if require_weights else True


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The repo's snapshot folder in the local Hugging Face cache, or None."""
    commit = hub.read_ref(repo, revision or "main")
    if commit is None:
        return None
    folder = hub.snapshot_dir(repo, commit)
    return folder if folder.is_dir() else None


def fetch_snapshot(
    repo: str,
    *,
    revision: str | None = None,
    offline: bool | None = None,
    progress: bool = False,
    require_weights: bool = True,
) -> tuple[Path, str]:
    """A Hub repo's files on disk, from the local cache or downloaded.

    Returns ``(folder, source)`` with source "hf-cache" or "hub". A model snapshot must
    hold config.json and, when `require_weights`, complete weights. A download fetches
    only what a model needs (see `pull.select_files`), file by file, with a progress bar
    per file when `progress`. Offline and not cached raises `ModelNotFoundError`.
    """
    from pardec_cli.store.pull import fetch_repo

    if offline is None:
        offline = env_offline()
    cached = cached_snapshot(repo, revision)
    if cached is not None and is_usable(cached, require_weights):
        return cached, "hf-cache"
    if offline:
        raise ModelNotFoundError(
            f"{repo} is not available offline (it is not in the Hugging Face cache)",
            hint="run once online (unset HF_HUB_OFFLINE) to download it, "
            "or pass a local model directory",
        )
    say = _say if progress else (lambda _msg: None)
    fetched = fetch_repo(repo, revision, progress=progress and sys.stderr.isatty(), say=say)
    return fetched.path, "hub"


def _say(message: str) -> None:
    print(f"pardec: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- resolve


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or (os.sep in spec and spec.count("/") != 1)


def _local(spec: str) -> ResolvedModel | None:
    """A model directory given by path, or None when `spec` is not an existing path."""
    path = Path(spec).expanduser()
    if not path.exists():
        if _looks_like_path(spec) and not looks_like_hub_id(spec):
            raise ModelNotFoundError(f"no such model directory: {spec}")
        return None
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedModel(name=spec, path=path.resolve(), source="local")
        if looks_like_hub_id(spec) or not _looks_like_path(spec):
            return None  # a folder that happens to be named like an alias or org/name
        raise ModelNotFoundError(
            f"{spec} is a directory but has no config.json (not a transformers model)"
        )
    if path.suffix.lower() == ".gguf":
        raise ModelNotFoundError(
            f"{spec} is a GGUF file: pardec runs it after importing it into its store",
            hint="import the GGUF first (pardec's GGUF import), then use the name you gave it",
        )
    if not _looks_like_path(spec):
        return None
    raise ModelNotFoundError(f"{spec} is a file, not a model directory")


def _from_store(name: str) -> ResolvedModel | None:
    if name.startswith(".") or "/" in name or os.sep in name:
        return None
    path = models_dir() / name
    if not is_complete(path):
        return None
    repo = read_marker(path).get("source_repo")
    return ResolvedModel(name=name, path=path, source="store", repo=repo or None)


def _from_pulls(spec: str) -> ResolvedModel | None:
    """A model pardec pulled, named by its name, alias or repo; its files all present.

    Accelerators pulled with another model count too (a drafter named by its alias).
    """
    all_records = records.all_records()
    for record in all_records:
        if record.matches(spec) and record.target.present():
            return ResolvedModel(record.name, record.target.snapshot, "hf-cache", record.target.repo)
    wanted = spec.strip().lower()
    for record in all_records:
        for acc in record.accelerators:
            if acc.kind == "drafter" and wanted in {acc.name.lower(), acc.repo.lower()} and acc.present():
                return ResolvedModel(acc.name, acc.snapshot, "hf-cache", acc.repo)
    return None


def unknown_model_error(spec: str) -> ModelNotFoundError:
    """"unknown model" with close aliases, pulled and store names as suggestions."""
    known = [*installed_models(), *(r.name for r in records.all_records())]
    close = suggest_aliases(spec)
    close += [n for n in difflib.get_close_matches(spec, known, n=2) if n not in close]
    if Path(spec).expanduser().is_dir():
        return ModelNotFoundError(
            f"{spec} is a directory but has no config.json (not a transformers model)"
        )
    if close:
        hint = "did you mean: " + ", ".join(close) + "?"
    else:
        hint = (
            "use a catalog alias (`pardec list --available` lists them), a Hub id "
            "like org/name, or a local directory"
        )
    return ModelNotFoundError(f"unknown model {spec!r}", hint=hint)


_unknown = unknown_model_error


def _download(spec: str, progress: bool) -> ResolvedModel:
    """Pull a model named by alias or Hub id (no accelerators) and record the pull."""
    from pardec_cli.store.pull import pull_model

    say = _say if progress else (lambda _msg: None)
    result = pull_model(spec, no_drafters=True, progress=progress and sys.stderr.isatty(), say=say)
    record = result.record
    return ResolvedModel(record.name, record.target.snapshot, "hub", record.target.repo)


def resolve_model(
    spec: str | None, *, offline: bool | None = None, progress: bool = False
) -> ResolvedModel:
    """Find (and if needed fetch) the model named by `spec`; see the module docstring.

    `offline` None means: as the environment says (HF_HUB_OFFLINE). `progress` lets
    downloads and the embedded conversion report on stderr. The model's last use is
    recorded (for `pardec list`).
    """
    resolved = _resolve(spec, offline=offline, progress=progress)
    records.touch(resolved.name, resolved.repo or "")
    return resolved


def _resolve(spec: str | None, *, offline: bool | None, progress: bool) -> ResolvedModel:
    if offline is None:
        offline = env_offline()
    spec = (spec or "").strip()
    if spec.lower() == EMBEDDED_ALIAS:
        pulled = _from_pulls(spec)
        if pulled is not None:
            return pulled
    if not spec or spec.lower() == EMBEDDED_ALIAS:
        path = ensure_embedded_model(progress, offline=offline)
        return ResolvedModel(EMBEDDED_ALIAS, path, "embedded", EMBEDDED_REPO)
    found = _local(spec) or _from_store(spec) or _from_pulls(spec)
    if found is not None:
        return found
    entry = lookup_alias(spec)
    repo = entry.repo if entry is not None else spec if looks_like_hub_id(spec) else None
    if repo is None:
        raise unknown_model_error(spec)
    revision = entry.revision if entry is not None else None
    name = entry.alias if entry is not None else spec
    cached = cached_snapshot(repo, revision)
    if cached is not None and is_usable(cached, require_weights=True):
        return ResolvedModel(name, cached, "hf-cache", repo)
    if offline:
        raise ModelNotFoundError(
            f"{name} is not available offline (it is not in the Hugging Face cache)",
            hint=f"run `pardec pull {name}` online (without HF_HUB_OFFLINE=1 / --offline), "
            "or pass a local model directory",
        )
    return _download(spec, progress)
