"""The layout of pardec's own model store (``models_dir()/<name>/``).

A model directory is a plain transformers checkpoint (config.json, *.safetensors,
tokenizer files) plus a marker file, ``pardec-model.json``, written last. The marker's
presence means "complete": a conversion that was interrupted never leaves a directory
that counts as a model, because it is built in a hidden temporary sibling and renamed
into place only once the marker is in it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import tempfile
import threading
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


def damaged_files(path: Path) -> list[str]:
    """Files the marker lists (name -> bytes) that are missing or not of that size.

    Markers written before sizes were recorded list none: nothing to compare."""
    sizes = read_marker(path).get("files")
    if not isinstance(sizes, dict):
        return []
    bad = []
    for name, size in sizes.items():
        try:
            if (path / str(name)).stat().st_size != size:
                bad.append(str(name))
        except OSError:
            bad.append(str(name))
    return bad


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
    """Write the marker file, which must be the last file written to a model directory.

    It lists every file's size, so a file truncated or replaced later is noticed
    (`damaged_files`)."""
    from pardec_cli.store.records import now

    sizes = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    record = {"format": 1, "created": now(), **fields, "files": sizes}
    (path / MARKER_NAME).write_text(json.dumps(record, indent=2) + "\n", "utf-8")


# Hidden siblings a store writer makes: ".NAME.tmp-PID-xxxx" (being built), ".NAME.old-PID-xxxx"
# (being replaced), ".NAME.rm-PID-xxxx" (being removed). Older versions wrote no PID.
_SCRATCH_RE = re.compile(r"\..+\.(?:tmp|old|rm)-(?:(\d+)-)?[^/]*")
_UNOWNED_STALE_S = 3600.0  # a scratch folder without a PID counts as stale after an hour


def scratch_prefix(name: str, kind: str) -> str:
    """The prefix of a scratch sibling of `name` ("tmp", "old", "rm"), naming this process."""
    return f".{name}.{kind}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def clean_stale_scratch(folder: Path) -> list[Path]:
    """Remove scratch folders in `folder` left by a pardec that was killed; return them.

    One whose process is still running is kept (a concurrent import), as is one without
    a PID (from an older version) that changed in the last hour."""
    removed = []
    try:
        entries = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return []
    for entry in entries:
        match = _SCRATCH_RE.fullmatch(entry.name)
        if match is None or not entry.is_dir() or entry.is_symlink():
            continue
        pid = match.group(1)
        try:
            stale = not _alive(int(pid)) if pid else time.time() - entry.stat().st_mtime > _UNOWNED_STALE_S
        except OSError:
            continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            if not entry.exists():
                removed.append(entry)
    return removed


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """Meanwhile, SIGTERM ends pardec like Ctrl-C does: through `finally` and `except`
    blocks (so a half-built folder is removed), with exit status 143.

    Python's default for SIGTERM is to die on the spot. Only the main thread can set
    signal handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    # Two writers may swap at once (two train-heads, two imports): the other's target can
    # appear between our "exists?" and our rename, which then fails on a non-empty folder.
    # Then move that one aside too and try again: the last writer wins, whole.
    for _ in range(100):
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=scratch_prefix(target.name, "old"), dir=target.parent))
            try:
                os.replace(target, old / target.name)
            except FileNotFoundError:  # another writer moved it aside first
                pass
            try:
                os.replace(tmp, target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue
            finally:
                shutil.rmtree(old, ignore_errors=True)
            return
        try:
            os.replace(tmp, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    raise OSError(errno.EBUSY, f"{target} kept changing while being replaced")


@contextmanager
def staged_model_dir(name: str, *, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary directory; on success, move it to ``models_dir()/name``.

    The temporary directory is a hidden sibling of the target, so the final rename is
    atomic. On any failure (including Ctrl-C) it is removed and the target is untouched.
    If a complete model of that name appears meanwhile (another process won the race),
    it is kept unless `overwrite`.
    """
    from pardec_cli.statefile import fs_error

    root = models_dir()
    target = root / check_model_name(name)
    try:
        root.mkdir(parents=True, exist_ok=True)
        clean_stale_scratch(root)
        tmp = Path(tempfile.mkdtemp(prefix=scratch_prefix(name, "tmp"), dir=root))
    except OSError as exc:
        raise fs_error(exc, f"writing to the model store {root}") from None
    with terminate_cleanly():
        try:
            yield tmp
            if not is_complete(tmp):
                raise PardecError(f"internal error: {tmp} was not completed")
            if is_complete(target) and not overwrite:
                shutil.rmtree(tmp)
                return
            swap_into_place(tmp, target)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise fs_error(exc, f"building {target}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
