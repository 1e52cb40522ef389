"""pardec's state files: read against a small schema, written atomically under a lock.

State files (pull records, ``usage.json``, tuned results, markers) are written by one
`pardec` while another may be reading or writing the same file. So every write

- holds a lock (``filelock``: a ``.NAME.lock`` sibling), so two writers take turns;
- re-reads the file under that lock and merges its own part into what it finds, so a
  second writer never throws away the first one's work (`update_json`);
- writes a temporary sibling and renames it over the file, so a reader (or a writer
  killed mid-write) never sees half a file.

Reading checks the shape, not only the syntax, against a declarative schema
(`check_shape`): a file of the right syntax but the wrong shape is one `StateFileError`
naming the file, the key at fault and the command that resets it, never a traceback
deep inside the code that uses the values.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pardec_cli.errors import PardecError

LOCK_TIMEOUT_S = 120.0


class StateFileError(PardecError):
    """A state file that exists but is not valid: names the file, the problem, the fix."""

    def __init__(self, path: Path, problem: str, reset: str) -> None:
        super().__init__(f"{path} is not valid: {problem}", hint=reset)
        self.path = path
        self.problem = problem


# ------------------------------------------------------------------ writing


def fs_error(exc: OSError, action: str) -> PardecError:
    """One clear line for a filesystem failure while `action` ("writing X", ...)."""
    what = exc.strerror or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        hint = "free some disk space, or point PARDEC_HOME at a bigger disk"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        hint = "make it writable, or point PARDEC_HOME (or PARDEC_CONFIG_DIR) at a writable folder"
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST):
        hint = "a file stands where pardec needs a folder: move it, or point PARDEC_HOME elsewhere"
    else:
        hint = None
    where = f" ({exc.filename})" if exc.filename else ""
    return PardecError(f"{action} failed: {what}{where}", hint=hint)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock of state file `path` (a hidden ``.NAME.lock`` sibling) meanwhile."""
    from filelock import FileLock, Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path.with_name(f".{path.name}.lock")), timeout=LOCK_TIMEOUT_S)
        lock.acquire()
    except Timeout:
        raise PardecError(
            f"another pardec has been writing {path} for {LOCK_TIMEOUT_S:.0f} s",
            hint="wait for it to finish, or stop it",
        ) from None
    except OSError as exc:
        raise fs_error(exc, f"writing {path}") from None
    try:
        yield
    finally:
        lock.release()


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling and a rename (caller holds the lock).

    A failure (a full disk, Ctrl-C, SIGTERM) leaves the old file as it was and no
    temporary file behind.
    """
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise fs_error(exc, f"writing {path}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def read_json(path: Path, schema: Any, reset: str) -> Any:
    """The JSON value in `path` checked against `schema`; None when the file is missing.

    A file that cannot be read, is not JSON, or has the wrong shape is a `StateFileError`.
    """
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError(path, f"cannot read it ({getattr(exc, 'strerror', None) or exc})", reset) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateFileError(path, f"not valid JSON ({exc})", reset) from None
    problem = check_shape(data, schema)
    if problem:
        raise StateFileError(path, problem, reset)
    return data


def update_json(path: Path, change: Callable[[Any], Any], schema: Any, reset: str) -> Any:
    """Under the lock: read `path` (None when missing or invalid), write `change(value)`.

    `change` merges this writer's part into the current contents, so concurrent writers
    of different parts all keep theirs. Returns what was written.
    """
    with locked(path):
        try:
            current = read_json(path, schema, reset)
        except StateFileError:
            current = None  # a broken file is replaced by this writer's part
        value = change(current)
        atomic_write(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        return value


# -------------------------------------------------------------------- shapes
#
# A schema is: a type (str, int, float, bool: a float is any finite number), a dict
# {key: schema} (an object with these keys; `Optional(schema)` marks a key that may be
# missing or null; other keys are allowed and ignored), a one-element list [schema] (a
# list of those), `MapOf(keys, values)` (an object with any keys), or a function that
# returns a problem (a string) or None.


@dataclass(frozen=True)
class Optional:
    schema: Any


@dataclass(frozen=True)
class MapOf:
    keys: Any
    values: Any


def check_shape(value: Any, schema: Any, where: str = "") -> str | None:
    """Why `value` does not fit `schema` ("target.files: must be an object"), or None."""
    at = f"{where}: " if where else ""
    if isinstance(schema, Optional):
        return None if value is None else check_shape(value, schema.schema, where)
    if schema is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{at}must be a finite number, not {value!r}"
        return None
    if schema is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"{at}must be an integer, not {value!r}"
    if isinstance(schema, type):
        return None if isinstance(value, schema) else f"{at}must be {_article(schema)}, not {type(value).__name__}"
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{at}must be an object, not {type(value).__name__}"
        for key, sub in schema.items():
            if key not in value or value[key] is None:
                if isinstance(sub, Optional):
                    continue
                return f"{_join(where, key)}: is missing"
            problem = check_shape(value[key], sub, _join(where, key))
            if problem:
                return problem
        return None
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            return f"{at}must be an object, not {type(value).__name__}"
        for key, sub in value.items():
            problem = check_shape(key, schema.keys, _join(where, str(key))) or check_shape(sub, schema.values, _join(where, str(key)))
            if problem:
                return problem
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{at}must be a list, not {type(value).__name__}"
        for index, item in enumerate(value):
            problem = check_shape(item, schema[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    problem = schema(value)
    return f"{at}{problem}" if problem else None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _article(kind: type) -> str:
    return {str: "a string", bool: "true or false", list: "a list", dict: "an object"}.get(kind, kind.__name__)


def non_negative(value: Any) -> str | None:
    """Schema check: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"must be a whole number >= 0, not {value!r}"
    return None


def relative_path(value: Any) -> str | None:
    """Schema check: a relative path that stays inside its folder (no '..', not absolute)."""
    if not isinstance(value, str) or not value:
        return f"must be a file name, not {value!r}"
    parts = value.replace("\\", "/").split("/")
    if value.startswith(("/", "\\")) or any(p in ("", ".", "..") for p in parts):
        return f"{value!r} is not a plain relative file name"
    return None
