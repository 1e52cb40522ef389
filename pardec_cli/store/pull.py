"""`pardec pull`: fetch a model and its accelerators into the Hugging Face cache.

A pull lists the repo's files at the wanted revision (one Hub call), chooses only what a
model needs (`select_files`), and downloads the files the cache does not hold yet, one
by one, through `hub.HubClient`. So:

- a second pull of the same model downloads nothing ("up to date");
- an interrupted pull resumes at the file level: finished files stay in the cache, the
  file that was cut off was only ever a temporary file (huggingface_hub renames a file
  into place when it is complete, and deletes the temporary file on Ctrl-C);
- ``refs/<revision>`` and pardec's pull record are written last, so a pull that did not
  finish is never taken for a complete model (config.json comes first, but a snapshot
  without all its weights does not count as usable).

Before any weight is downloaded, the architecture is checked against transformers and
the free disk space against the bytes still missing. Every file, downloaded now or found
on disk, is checked against the size and hash the Hub lists (the LFS sha256, else the git
blob id): a damaged file is deleted and fetched once more, so a later pull repairs what
it finds damaged. Safetensors headers are checked too. A failed check removes what this
pull downloaded.

Accelerators (drafters, Medusa/EAGLE heads) come from the catalog; a drafter's tokenizer
is compared with the target's and a head's config with the target's config; the result
is recorded and a mismatch is an error that names what differs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pardec_cli.errors import ModelLoadError, ModelNotFoundError, PardecError, PardecUsageError, first_line
from pardec_cli.store import hub, records
from pardec_cli.store.catalog import Accelerator, CatalogEntry, entry_for_repo, lookup_alias
from pardec_cli.store.records import COMPATIBLE, INCOMPATIBLE, UNCHECKED, PullRecord, RepoRecord

Say = Callable[[str], None]

# Small files a model needs besides config.json and its weights (top level only).
MODEL_EXTRA_FILES = frozenset({
    "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "vocab.txt",
    "tokenizer.model", "spiece.model", "chat_template.json", "chat_template.jinja",
})  # fmt: skip
_EXTRA_SUFFIXES = (".tiktoken", ".jinja")
_SAFETENSORS_INDEX = re.compile(r".*\.safetensors\.index\.json")
_BIN_INDEX = re.compile(r".*\.bin\.index\.json")
# Pickled files that are not weights (training state); never fetched.
_NOT_WEIGHTS = re.compile(r"(training_args|optimizer|scheduler|rng_state.*|trainer_state)\.(bin|pt|pth)")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")

HEAD_KINDS = ("medusa", "eagle", "eagle3")


def _quiet(_: str) -> None:
    pass


def human_size(n: float) -> str:
    """Bytes for people: 538.1 MB, 3.4 GB (decimal units, as the Hub shows them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


# ------------------------------------------------------------ file selection


class DiskSpaceError(PardecError):
    """Not enough free space for what is still to be downloaded."""


def _top_level(files: dict[str, int | None]) -> list[str]:
    return sorted(name for name in files if "/" not in name)


def _weights(files: list[str], kind: str, read_index: Callable[[str], dict[str, Any]]) -> list[str]:
    """The weight files to fetch: safetensors when there are any, else pickles."""
    indexes = [f for f in files if _SAFETENSORS_INDEX.fullmatch(f)]
    if indexes:  # sharded: exactly the shards the index names (not duplicate copies)
        shards: set[str] = set()
        for index in indexes:
            weight_map = read_index(index).get("weight_map", {})
            shards.update(str(v) for v in weight_map.values())
        return [*indexes, *sorted(shards)]
    safetensors = [f for f in files if f.endswith(".safetensors")]
    if safetensors:
        return safetensors
    pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES) and not _NOT_WEIGHTS.fullmatch(f)]
    if kind == "model":  # a transformers checkpoint: pytorch_model*.bin and its index
        pickles = [f for f in pickles if f.endswith(".bin")]
        pickles += [f for f in files if _BIN_INDEX.fullmatch(f)]
    return sorted(pickles)


def select_files(
    repo: str, files: dict[str, int | None], kind: str, read_index: Callable[[str], dict[str, Any]]
) -> list[str]:
    """What to fetch from a repo's top level for a model (`kind` "model") or a head.

    Models: config.json, generation config, tokenizer and chat template files, and the
    safetensors weights (the shards its index names), or the ``pytorch_model*.bin``
    files only when the repo has no safetensors. Heads: config.json and safetensors,
    else their ``.bin``/``.pt`` pickles (loaded with ``weights_only=True``). Never
    README, ONNX/GGUF/original copies, or training state.
    """
    top = _top_level(files)
    if kind == "model" and "config.json" not in top:
        gguf = any(f.endswith(".gguf") for f in top)
        raise ModelLoadError(
            f"{repo} has no config.json: it is not a transformers model",
            hint="download its .gguf file and run `pardec import FILE.gguf`"
            if gguf
            else "pull a repo that holds a transformers checkpoint",
        )
    wanted = [f for f in top if f == "config.json"]
    if kind == "model":
        wanted += [f for f in top if f in MODEL_EXTRA_FILES or f.endswith(_EXTRA_SUFFIXES)]
    weights = _weights(top, kind, read_index)
    if not any(not _SAFETENSORS_INDEX.fullmatch(w) and not _BIN_INDEX.fullmatch(w) for w in weights):
        raise ModelLoadError(f"{repo} holds no weights pardec can load (*.safetensors or *.bin)")
    missing_shards = [w for w in weights if w not in files]
    if missing_shards:
        raise ModelLoadError(f"{repo} is incomplete: its index names {missing_shards[0]}, which the repo lacks")
    return wanted + [w for w in weights if w not in wanted]


def _order(names: list[str], sizes: dict[str, int | None]) -> list[str]:
    """config.json first, then small files, then weights from small to large."""

    def key(name: str) -> tuple[int, int, str]:
        weight = name.endswith((".safetensors", *PICKLE_SUFFIXES))
        return (0 if name == "config.json" else 2 if weight else 1, sizes.get(name) or 0, name)

    return sorted(names, key=key)


# ------------------------------------------------------------- architecture


def check_architecture(config: dict[str, Any], repo: str) -> None:
    """Raise `ModelLoadError` unless transformers can load `config` as a causal LM."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"transformers {transformers.__version__} cannot load architecture {model_type!r} ({repo})",
            hint="upgrade transformers (pip install -U transformers) if the architecture is new; "
            "pardec never runs code shipped with a model",
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(f"{repo} is a {model_type!r} model, not a causal language model")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ------------------------------------------------------------ one repository


@dataclass
class Fetched:
    """The outcome of fetching one repo: its record and what this call downloaded."""

    record: RepoRecord
    downloaded: list[str] = field(default_factory=list)
    bytes: int = 0

    @property
    def path(self) -> Path:
        return self.record.snapshot


def _usable_snapshot(snap: Path, kind: str) -> bool:
    """A cached snapshot that can stand in for a pull (offline): config + complete weights."""
    if not snap.is_dir():
        return False
    if kind == "model" and not (snap / "config.json").is_file():
        return False
    for index in snap.glob("*.index.json"):
        weight_map = read_json(index).get("weight_map", {})
        if not all((snap / str(shard)).is_file() for shard in set(weight_map.values())):
            return False
    return any(p.is_file() and p.name.endswith((".safetensors", *PICKLE_SUFFIXES)) for p in snap.iterdir())


def _fetch_offline(repo: str, revision: str | None, kind: str) -> Fetched:
    """A repo that is already on disk: from a pull record, else from the cache's refs."""
    for record in records.all_records():
        for rec in record.repos():
            if rec.repo.lower() == repo.lower() and rec.revision == (revision or "main") and rec.present():
                return Fetched(RepoRecord(rec.repo, rec.revision, rec.commit, rec.cache, dict(rec.files)))
    cache = hub.cache_root()
    commit = hub.read_ref(repo, revision or "main", cache)
    if commit is not None:
        snap = hub.snapshot_dir(repo, commit, cache)
        if _usable_snapshot(snap, kind):
            files = {
                str(p.relative_to(snap)): p.stat().st_size for p in sorted(snap.rglob("*")) if p.is_file()
            }
            return Fetched(RepoRecord(repo, revision or "main", commit, str(cache.absolute()), files))
    raise ModelNotFoundError(
        f"{repo} is not available offline (it is not in the Hugging Face cache)",
        hint="run the pull again online (without --offline / HF_HUB_OFFLINE=1), "
        "or pass a local model directory",
    )


def fetch_repo(
    repo: str,
    revision: str | None = None,
    *,
    kind: str = "model",
    offline: bool = False,
    progress: bool = False,
    say: Say = _quiet,
    display: Any = None,
    overall: Any = None,
) -> Fetched:
    """Make `repo` at `revision` complete in the cache; download only what is missing.

    `kind` is "model" (a transformers checkpoint: target or drafter) or a head kind.
    Offline, the repo must already be there (`ModelNotFoundError` otherwise). With a
    live `display` the file bars are drawn there, and `overall` (a task of it) grows by
    the bytes this repo still needs and advances as they arrive.
    """
    if offline:
        return _fetch_offline(repo, revision, kind)
    client = hub.get_client()
    listing = hub.call(lambda: client.listing(repo, revision), repo, revision)
    cache = hub.cache_root()
    hub.remove_stale_partials(repo, cache)  # what a killed pull left half-downloaded
    snap = hub.snapshot_dir(repo, listing.commit, cache)
    fetched = Fetched(RepoRecord(repo, listing.revision, listing.commit, str(cache.absolute())))

    counted: set[str] = set()  # the files whose bytes the overall bar expects

    def download(name: str) -> Path:
        extra = {} if display is None else {"display": display, "overall": overall if name in counted else None}
        return hub.call(lambda: client.download(repo, name, listing.commit, progress=progress, **extra), repo, revision)

    def get(name: str) -> Path:
        """Download `name` unless present, and check it against the Hub's hash and size:
        a file that fails is deleted and fetched once more, then it is an error."""
        existed = (snap / name).exists()
        path = download(name)
        problem = hub.content_problem(path, listing.hashes.get(name), listing.files.get(name))
        if problem is not None:
            say(f"  {name} is damaged ({problem}): downloading it again")
            hub.remove_snapshot_files(repo, listing.commit, [name], cache)
            existed = False
            path = download(name)
            problem = hub.content_problem(path, listing.hashes.get(name), listing.files.get(name))
            if problem is not None:
                fetched.downloaded.append(name)
                raise ModelLoadError(
                    f"{name} of {repo} is corrupt after downloading it twice: {problem}",
                    hint="try again later; if it persists, the repo's file is broken",
                )
        if not existed and name not in fetched.downloaded:
            fetched.downloaded.append(name)
            size = path.stat().st_size
            fetched.bytes += size
            if not progress:  # on a terminal the bar already said it
                say(f"  {name}  {human_size(size)}")
        return path

    try:
        wanted = select_files(repo, listing.files, kind, lambda index: read_json(get(index)))
        # Files already on disk are checked too (a pull after damage repairs it): by
        # size and hash, as if just downloaded; a damaged one is fetched again.
        for name in wanted:
            if (snap / name).exists() and name not in fetched.downloaded:
                problem = hub.content_problem(snap / name, listing.hashes.get(name), listing.files.get(name))
                if problem is not None:
                    say(f"  {name} is damaged ({problem}): downloading it again")
                    hub.remove_snapshot_files(repo, listing.commit, [name], cache)
        missing = [name for name in wanted if not (snap / name).exists()]
        if missing:
            need = sum(listing.files.get(name) or 0 for name in missing)
            free = hub.free_bytes(cache)
            if need > free:
                raise DiskSpaceError(
                    f"not enough disk space for {repo}: {human_size(need)} still to download, "
                    f"{human_size(free)} free in {cache}",
                    hint="free some space, or point HF_HUB_CACHE at a bigger disk",
                )
            if overall is not None:
                counted.update(name for name in missing if name != "config.json")
                overall.add_total(sum(listing.files.get(name) or 0 for name in counted))
            if kind == "model":
                check_architecture(read_json(get("config.json")), repo)
            for name in _order(missing, listing.files):
                path = get(name)
                if name.endswith(".safetensors"):
                    from pardec_cli.store.loading import check_safetensors_file

                    check_safetensors_file(path)
    except (ModelLoadError, DiskSpaceError):
        hub.remove_snapshot_files(repo, listing.commit, fetched.downloaded, cache)
        raise
    hub.write_ref(repo, listing.revision, listing.commit, cache)
    fetched.record.files = {name: (snap / name).stat().st_size for name in wanted}
    return fetched


# ----------------------------------------------------------- compatibility


def check_drafter(target_dir: Path, drafter_dir: Path, target_tokenizer: Any = None) -> tuple[str, str]:
    """(status, detail) of a drafter: does its tokenizer map text to the target's ids?"""
    from transformers import AutoTokenizer

    from pardec_cli.store.loading import quiet_transformers
    from pardec_cli.store.tokenizer_compat import tokenizer_mismatch

    try:
        with quiet_transformers():
            target = target_tokenizer or AutoTokenizer.from_pretrained(str(target_dir))
            drafter = AutoTokenizer.from_pretrained(str(drafter_dir))
    except Exception as exc:  # a tokenizer that does not load cannot be compared
        return UNCHECKED, f"cannot load a tokenizer: {first_line(exc)}"
    problem = tokenizer_mismatch(target, drafter)
    if problem:
        return INCOMPATIBLE, problem
    return COMPATIBLE, f"same tokenizer, {len(drafter.get_vocab())} tokens"


def check_head(kind: str, head_dir: Path, target_dir: Path, target_repo: str) -> tuple[str, str]:
    """(status, detail) of a Medusa/EAGLE head: was it trained for this target?"""
    head = read_json(head_dir / "config.json")
    target = read_json(target_dir / "config.json")
    if not head:
        return UNCHECKED, "the head has no config.json"
    problems = []
    base = head.get("base_model_name_or_path")
    if isinstance(base, str) and base.strip():
        if base.rstrip("/").split("/")[-1].lower() != target_repo.split("/")[-1].lower():
            problems.append(f"it was trained for {base}, not {target_repo}")
    if kind in ("eagle", "eagle3"):
        for key in ("hidden_size", "vocab_size"):
            if key in head and key in target and head[key] != target[key]:
                problems.append(f"{key} differs: model {target[key]}, head {head[key]}")
    if problems:
        return INCOMPATIBLE, "; ".join(problems)
    return COMPATIBLE, "trained for this model" if base else "hidden size and vocabulary match"


# -------------------------------------------------------------- whole model


@dataclass(frozen=True)
class Target:
    """What a pull spec names: the record name, alias, repo and revision."""

    name: str
    repo: str
    revision: str | None
    alias: str | None = None
    entry: CatalogEntry | None = None


@dataclass(frozen=True)
class Planned:
    """One accelerator to pull."""

    kind: str
    name: str
    repo: str
    revision: str | None

    @property
    def method(self) -> str:
        return Accelerator(self.kind, self.name).method


def plan_target(spec: str, revision: str | None = None) -> Target:
    """Turn a pull spec (alias or Hub id) into a `Target`; clear errors for the rest."""
    from pardec_cli.store.layout import installed_models
    from pardec_cli.store.resolve import looks_like_hub_id, unknown_model_error

    spec = spec.strip()
    if not spec:
        raise PardecUsageError("which model? pass an alias (`pardec list --available` shows them) or a Hub id org/name")
    if spec.lower().endswith(".gguf"):
        raise PardecUsageError(
            f"{spec} is a GGUF file: import it instead of pulling it",
            hint=f"pardec import {spec} --name NAME",
        )
    entry = lookup_alias(spec)
    if entry is None and looks_like_hub_id(spec):
        entry = entry_for_repo(spec)
        if entry is None:
            return Target(spec, spec, revision)
    if entry is not None:
        return Target(entry.alias, entry.repo, revision or entry.revision, entry.alias, entry)
    if Path(spec).expanduser().is_dir():
        raise PardecUsageError(f"{spec} is a local directory: nothing to pull", hint=f"use it as is: -m {spec}")
    if spec in installed_models():
        raise PardecUsageError(f"{spec} is already in pardec's store (imported): nothing to pull")
    raise unknown_model_error(spec)


def plan_accelerators(target: Target, *, no_drafters: bool, chosen: tuple[str, ...]) -> list[Planned]:
    """The accelerators to pull: the catalog's, only `chosen`, or none."""
    from pardec_cli.store.resolve import looks_like_hub_id, unknown_model_error

    if no_drafters and chosen:
        raise PardecUsageError("--no-drafters and --drafter exclude each other")
    if no_drafters:
        return []
    listed = target.entry.accelerators() if target.entry else []

    def planned(kind: str, ref: str) -> Planned:
        entry = lookup_alias(ref)
        if entry is not None:
            return Planned(kind, entry.alias, entry.repo, entry.revision)
        return Planned(kind, ref, ref, None)

    if not chosen:
        plans = [planned(a.kind, a.ref) for a in listed]
    else:
        plans = []
        for name in chosen:
            match = next((a for a in listed if a.ref.lower() == name.strip().lower()), None)
            if match is None:
                entry = lookup_alias(name)
                repo = entry.repo if entry else name.strip()
                match = next((a for a in listed if planned(a.kind, a.ref).repo.lower() == repo.lower()), None)
            if match is not None:
                plans.append(planned(match.kind, match.ref))
            elif lookup_alias(name) is not None or looks_like_hub_id(name.strip()):
                plans.append(planned("drafter", name.strip()))
            else:
                raise unknown_model_error(name)
    seen: set[str] = set()
    unique = []
    for plan in plans:
        if plan.repo.lower() != target.repo.lower() and plan.repo.lower() not in seen:
            seen.add(plan.repo.lower())
            unique.append(plan)
    return unique


@dataclass
class PullResult:
    """What a pull did: the record written, bytes downloaded, and per-repo notes."""

    record: PullRecord
    downloaded_bytes: int = 0
    removed_bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.record.target.snapshot


def _referenced_elsewhere(name: str) -> set[tuple[str, str, str, str]]:
    """(cache, repo, commit, file) of every file that records other than `name` hold."""
    held = set()
    for record in records.all_records():
        if record.name.lower() == name.lower():
            continue
        for rec in record.repos():
            held.update((rec.cache, rec.repo.lower(), rec.commit, f) for f in rec.files)
    return held


def release(rec: RepoRecord, keep: set[tuple[str, str, str, str]], problems: list[str] | None = None) -> int:
    """Remove a repo record's files from the cache, except those in `keep`; bytes freed.

    Entries that would lead out of the repo's cache folder are left alone and described
    in `problems` (`hub.remove_snapshot_files`)."""
    names = [f for f in rec.files if (rec.cache, rec.repo.lower(), rec.commit, f) not in keep]
    return hub.remove_snapshot_files(rec.repo, rec.commit, names, Path(rec.cache), problems)


def pull_model(
    spec: str,
    *,
    revision: str | None = None,
    no_drafters: bool = False,
    drafters: tuple[str, ...] = (),
    offline: bool = False,
    progress: bool = False,
    say: Say = _quiet,
) -> PullResult:
    """Pull a model and its accelerators; record the result; return it.

    Accelerators that fail (not found, gated, offline, incompatible) do not undo the
    target: they are listed in ``problems`` (and incompatible ones recorded as such);
    the caller turns them into an error.
    """
    from pardec_cli.progress import ProgressDisplay

    target = plan_target(spec, revision)
    plans = plan_accelerators(target, no_drafters=no_drafters, chosen=drafters)
    # On a terminal (`progress`): one live display, a bar per file plus one for the whole
    # pull (its total grows as each repo's missing files become known).
    with ProgressDisplay(progress and not offline, transfer=True) as display:
        if display.enabled:
            say = _above(display, say)
        overall = display.task(f"{target.name}: all files", 0) if display.enabled else None
        return _pull(target, plans, offline=offline, progress=progress, say=say, display=display, overall=overall)


def _above(display: Any, say: Say) -> Say:
    """`say`, but printed above the live display, which would otherwise overwrite it."""
    if say is _quiet:
        return say
    return lambda message: display.print(f"pardec: {message}")


def _pull(target: Target, plans: list[Planned], *, offline: bool, progress: bool, say: Say, display: Any,
          overall: Any) -> PullResult:  # fmt: skip
    """`pull_model` once the plan is made (and the display, if any, is up)."""
    where = f"{target.repo}" + (f" @ {target.revision}" if target.revision else "")
    if not offline:
        say(f"pulling {target.name}" + (f" ({where})" if target.name != target.repo or target.revision else ""))
    fetched = fetch_repo(target.repo, target.revision, offline=offline, progress=progress, say=say,
                         display=display, overall=overall)  # fmt: skip
    if not fetched.downloaded:
        say(f"{target.name}: up to date ({fetched.record.revision} @ {fetched.record.commit[:8]})")
    previous = records.find(target.name)
    record = PullRecord(target.name, fetched.record, alias=target.alias)
    if previous is not None:
        record.pulled_at = previous.pulled_at if not fetched.downloaded else record.pulled_at
        record.accelerators = [a for a in previous.accelerators if a.present()]
    records.save(record)
    result = PullResult(record, downloaded_bytes=fetched.bytes)
    if previous is not None and previous.target.commit != record.target.commit:
        result.removed_bytes += release(previous.target, _referenced_elsewhere(""))

    tokenizers: dict[str, Any] = {}
    for plan in plans:
        say(f"{plan.kind} {plan.name} (for --method {plan.method})")
        kind = "model" if plan.kind == "drafter" else "head"
        try:
            acc = fetch_repo(plan.repo, plan.revision, kind=kind, offline=offline, progress=progress, say=say,
                             display=display, overall=overall)  # fmt: skip
        except PardecError as exc:
            result.problems.append(f"{plan.name}: {exc.message}")
            say(f"{plan.name}: {exc.message}")
            continue
        result.downloaded_bytes += acc.bytes
        rec = acc.record
        rec.kind, rec.name = plan.kind, plan.name
        rec.status, rec.detail = _compatibility(plan, rec, record, previous, tokenizers)
        record.accelerators = [a for a in record.accelerators if a.repo.lower() != rec.repo.lower()] + [rec]
        records.save(record)
        say(f"{plan.name}: {rec.status}" + (f" ({rec.detail})" if rec.detail else ""))
        if rec.status == INCOMPATIBLE:
            what = "does not share the tokenizer of" if plan.kind == "drafter" else "was not made for"
            result.problems.append(f"{plan.kind} {plan.name} {what} {target.name}: {rec.detail}")
    return result


def _compatibility(
    plan: Planned, rec: RepoRecord, record: PullRecord, previous: PullRecord | None, tokenizers: dict[str, Any]
) -> tuple[str, str]:
    """Check an accelerator against the target, unless neither changed since the last check."""
    if previous is not None and previous.target.commit == record.target.commit:
        known = next((a for a in previous.accelerators if a.repo.lower() == rec.repo.lower()), None)
        if known is not None and known.commit == rec.commit and known.status != UNCHECKED:
            return known.status, known.detail
    if plan.kind == "drafter":
        if "target" not in tokenizers:
            tokenizers["target"] = _load_tokenizer(record.target.snapshot)
        return check_drafter(record.target.snapshot, rec.snapshot, tokenizers["target"])
    return check_head(plan.kind, rec.snapshot, record.target.snapshot, record.target.repo)


def _load_tokenizer(path: Path) -> Any:
    """The target's tokenizer for compatibility checks (None when it does not load)."""
    from transformers import AutoTokenizer

    from pardec_cli.store.loading import quiet_transformers

    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path))
    except Exception:
        return None
