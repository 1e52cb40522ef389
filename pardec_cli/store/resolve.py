"""From what the user typed (``-m ...``) to a model directory on disk.

`resolve_model` tries, in order:

1. nothing, or the embedded alias ``smollm2-135m`` -> the embedded model ("embedded");
2. an existing directory with a config.json -> used in place ("local");
3. a complete model in pardec's store, ``models_dir()/<name>`` ("store");
4. a catalog alias -> its Hub repo, then as 5.;
5. a Hub id ``org/name`` -> the local Hugging Face cache ("hf-cache"), else a download
   ("hub") unless offline.

Every failure is a one-line `PardecError` (usually `ModelNotFoundError`) with a hint.
huggingface_hub is imported lazily; tests never reach the network (offline mode).
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pardec_cli.errors import ModelNotFoundError, PardecError
from pardec_cli.home import models_dir
from pardec_cli.store.catalog import CatalogEntry, load_catalog, lookup_alias, suggest_aliases
from pardec_cli.store.embedded import EMBEDDED_ALIAS, EMBEDDED_REPO, ensure_embedded_model
from pardec_cli.store.layout import installed_models, is_complete, read_marker

# What a model needs from a Hub repo (no ONNX/GGUF/original/... duplicates).
MODEL_PATTERNS: tuple[str, ...] = (
    "*.safetensors", "*.json", "tokenizer*", "*.jinja", "*.model", "*.tiktoken",
    "merges.txt", "vocab.txt",
)  # fmt: skip
# Fetched only when a repo has no safetensors weights (older repos, e.g. Vicuna).
BIN_PATTERNS: tuple[str, ...] = ("pytorch_model*.bin", "model*.bin", "*.bin.index.json")
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".pth")

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


def hub_cache_dir() -> Path | None:
    """The Hugging Face hub cache as the environment says now (HF_HUB_CACHE, HF_HOME).

    Read at call time, not at huggingface_hub's import time, so a changed environment
    (tests, `--offline` wrappers) is honoured. None means huggingface_hub's default.
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return None


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` with Hub-legal characters (no local path syntax)."""
    return bool(_HUB_ID_RE.fullmatch(spec)) and ".." not in spec and not spec.endswith(".")


# ------------------------------------------------------------------- Hub access


@contextmanager
def _quiet_hub(progress: bool) -> Iterator[None]:
    """Hide huggingface_hub's warnings, and its progress bars unless `progress`."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from huggingface_hub.utils import logging as hub_logging

    bars_were_disabled = are_progress_bars_disabled()
    verbosity = hub_logging.get_verbosity()
    if not progress:
        disable_progress_bars()
    hub_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_logging.set_verbosity(verbosity)
        if not progress and not bars_were_disabled:
            enable_progress_bars()


def _has_weights(path: Path) -> bool:
    return any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file())


def _is_usable(path: Path, require_weights: bool) -> bool:
    if not (path / "config.json").is_file():
        return False
    return _has_weights(path) if require_weights else True


def _cached_snapshot(
    repo: str, revision: str | None, patterns: Sequence[str] | None
) -> Path | None:
    """The repo's snapshot folder in the local Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download

    try:
        with _quiet_hub(progress=False):
            folder = snapshot_download(
                repo,
                revision=revision,
                cache_dir=hub_cache_dir(),
                local_files_only=True,
                allow_patterns=list(patterns) if patterns else None,
            )
    except Exception:  # not cached, partial, invalid: all mean "not usable offline"
        return None
    return Path(str(folder))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _download(repo: str, revision: str | None, patterns: Sequence[str] | None,
              progress: bool) -> Path:  # fmt: skip
    """snapshot_download with huggingface_hub's errors turned into `PardecError`."""
    from huggingface_hub import errors, snapshot_download

    try:
        with _quiet_hub(progress):
            folder = snapshot_download(
                repo,
                revision=revision,
                cache_dir=hub_cache_dir(),
                allow_patterns=list(patterns) if patterns else None,
            )
    except errors.GatedRepoError:
        raise ModelNotFoundError(
            f"{repo} is gated on the Hugging Face Hub: it needs an accepted licence and a login",
            hint=f"accept the terms at https://huggingface.co/{repo}, then run "
            "`huggingface-cli login` (or set HF_TOKEN)",
        ) from None
    except errors.RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"model repository {repo!r} was not found on the Hugging Face Hub",
            hint="check the name; for a private repo run `huggingface-cli login` "
            "(or set HF_TOKEN)",
        ) from None
    except errors.RevisionNotFoundError:
        raise ModelNotFoundError(f"revision {revision!r} of {repo} does not exist") from None
    except errors.LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"cannot download {repo}: the Hugging Face Hub is unreachable and it is not cached",
            hint="check the network connection (or a proxy), or pass a local model directory",
        ) from None
    except errors.HfHubHTTPError as exc:
        raise PardecError(f"downloading {repo} failed: {_first_line(exc)}") from None
    except OSError as exc:
        raise PardecError(f"downloading {repo} failed: {_first_line(exc)}") from None
    except Exception as exc:  # httpx connection/timeouts and the like
        raise PardecError(
            f"downloading {repo} failed: {type(exc).__name__}: {_first_line(exc)}",
            hint="check the network connection, or pass a local model directory",
        ) from None
    return Path(str(folder))


def fetch_snapshot(
    repo: str,
    *,
    revision: str | None = None,
    offline: bool | None = None,
    progress: bool = False,
    allow_patterns: Sequence[str] | None = MODEL_PATTERNS,
    require_weights: bool = True,
) -> tuple[Path, str]:
    """A Hub repo's files on disk, from the local cache or downloaded.

    Returns ``(folder, source)`` with source "hf-cache" or "hub". `allow_patterns`
    limits what is fetched (None: everything, e.g. for Medusa/EAGLE heads). A model
    snapshot must hold config.json and, when `require_weights`, weight files; repos
    without safetensors get their ``*.bin`` weights. Offline and not cached raises
    `ModelNotFoundError`.
    """
    if offline is None:
        offline = env_offline()
    cached = _cached_snapshot(repo, revision, allow_patterns)
    if cached is not None and _is_usable(cached, require_weights):
        return cached, "hf-cache"
    if offline:
        raise ModelNotFoundError(
            f"{repo} is not available offline (it is not in the Hugging Face cache)",
            hint="run once online (unset HF_HUB_OFFLINE) to download it, "
            "or pass a local model directory",
        )
    folder = _download(repo, revision, allow_patterns, progress)
    if require_weights and allow_patterns is not None and not _has_weights(folder):
        folder = _download(repo, revision, (*allow_patterns, *BIN_PATTERNS), progress)
    if not _is_usable(folder, require_weights):
        raise ModelNotFoundError(
            f"{repo} does not look like a transformers model (no config.json or no weights)"
        )
    return folder, "hub"


# --------------------------------------------------------------------- resolve


def entry_for_repo(repo: str) -> CatalogEntry | None:
    """The catalog entry whose repo is `repo` (case-insensitive), or None."""
    wanted = repo.lower()
    return next((e for e in load_catalog().values() if e.repo.lower() == wanted), None)


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


def _unknown(spec: str) -> ModelNotFoundError:
    close = suggest_aliases(spec)
    close += [n for n in difflib.get_close_matches(spec, installed_models(), n=2) if n not in close]
    if Path(spec).expanduser().is_dir():
        return ModelNotFoundError(
            f"{spec} is a directory but has no config.json (not a transformers model)"
        )
    if close:
        hint = "did you mean: " + ", ".join(close) + "?"
    else:
        hint = (
            "use a catalog alias (e.g. smollm2-135m), a Hub id like org/name, "
            "or a local directory"
        )
    return ModelNotFoundError(f"unknown model {spec!r}", hint=hint)


def resolve_model(
    spec: str | None, *, offline: bool | None = None, progress: bool = False
) -> ResolvedModel:
    """Find (and if needed fetch) the model named by `spec`; see the module docstring.

    `offline` None means: as the environment says (HF_HUB_OFFLINE). `progress` lets
    downloads and the embedded conversion report on stderr.
    """
    if offline is None:
        offline = env_offline()
    spec = (spec or "").strip()
    if not spec or spec.lower() == EMBEDDED_ALIAS:
        path = ensure_embedded_model(progress, offline=offline)
        return ResolvedModel(EMBEDDED_ALIAS, path, "embedded", EMBEDDED_REPO)
    found = _local(spec) or _from_store(spec)
    if found is not None:
        return found
    entry = lookup_alias(spec)
    if entry is not None:
        path, source = fetch_snapshot(
            entry.repo, revision=entry.revision, offline=offline, progress=progress
        )
        return ResolvedModel(entry.alias, path, source, entry.repo)
    if looks_like_hub_id(spec):
        path, source = fetch_snapshot(spec, offline=offline, progress=progress)
        return ResolvedModel(spec, path, source, spec)
    raise _unknown(spec)
