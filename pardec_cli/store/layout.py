"""The layout of pardec's own model store (``models_dir()/<name>/``).

A model directory is a plain transformers checkpoint (config.json, *.safetensors,
tokenizer files) plus a marker file, ``pardec-model.json``, written last. The marker's
presence means "complete": a conversion that was interrupted never leaves a directory
that counts as a model, because it is built in a hidden temporary sibling and renamed
into place only once the marker is in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.home import models_dir

MARKER_NAME = "pardec-model.json"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_model_name(name: str) -> str:
    """Return `name` if it can name a store directory, else raise `PardecUsageError`."""
    if not _NAME_RE.fullmatch(name or "") or name.endswith(".gguf"):
        raise PardecUsageError(
            f"invalid model name {name!r}",
            hint="use letters, digits, '.', '_' and '-' (for example smollm2-135m-q4)",
        )
    return name


def is_complete(path: Path) -> bool:
    """Whether `path` is a finished model directory (marker and config.json present)."""
    return (path / MARKER_NAME).is_file() and (path / "config.json").is_file()


def read_json_object(file: Path) -> dict[str, Any]:
    """A JSON object from `file` (empty when the file is missing, unreadable or not an object)."""
    try:
        data = json.loads(file.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_marker(path: Path) -> dict[str, Any]:
    """The marker's contents (empty when missing or unreadable)."""
    return read_json_object(path / MARKER_NAME)


def recorded_gguf(path: Path) -> Path | None:
    """The GGUF file the model in `path` was imported from, as its marker records it
    (``pardec import`` and the embedded model's conversion write it), or None."""
    value = read_marker(path).get("gguf")
    return Path(value) if isinstance(value, str) and value else None


def write_marker(path: Path, **fields: Any) -> None:
    """Write the marker file, which must be the last file written to a model directory."""
    record = {"format": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    (path / MARKER_NAME).write_text(json.dumps(record, indent=2) + "\n", "utf-8")


def installed_models() -> list[str]:
    """Names of the complete models in the store, sorted."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and is_complete(p))


def _apply_umask(folder: Path) -> None:
    """Give `folder` and its files the usual permissions (mkdtemp makes them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.rglob("*"):
        file.chmod((0o777 if file.is_dir() else 0o666) & ~umask)


def swap_into_place(tmp: Path, target: Path) -> None:
    """Make the finished directory `tmp` (a sibling of `target`) be `target`, atomically.

    Readers see the old contents or the new ones, never half of either: an existing
    `target` is first renamed into a hidden sibling, then removed. `tmp` gets the usual
    permissions first (mkdtemp makes it private).
    """
    _apply_umask(tmp)
    if target.exists() or target.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


@contextmanager
def staged_model_dir(name: str, *, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary directory; on success, move it to ``models_dir()/name``.

    The temporary directory is a hidden sibling of the target, so the final rename is
    atomic. On any failure (including Ctrl-C) it is removed and the target is untouched.
    If a complete model of that name appears meanwhile (another process won the race),
    it is kept unless `overwrite`.
    """
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / check_model_name(name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
    try:
        yield tmp
        if not is_complete(tmp):
            raise PardecError(f"internal error: {tmp} was not completed")
        if is_complete(target) and not overwrite:
            shutil.rmtree(tmp)
            return
        swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
