"""Errors that reach the user as one clear line (never a traceback).

The CLI catches `PardecError`, prints `pardec: error: <message>` (plus the hint on a
second line when there is one) to stderr and exits with `exit_code`.

The engine and the methods never name a command-line flag: where the remedy is a flag
or a chat command, they raise a typed error that carries the facts (which setting,
which cache) and each front end words it (`cli.main.cli_words`, the chat's own text).
"""

from __future__ import annotations


class PardecError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class PardecUsageError(PardecError):
    """Bad input on the command line (unknown method, empty prompt...): exit code 2."""

    exit_code = 2


class ModelNotFoundError(PardecError):
    """The named model is neither local nor obtainable."""


class ModelLoadError(PardecError):
    """The model's files exist but cannot be loaded (corrupt, unsupported architecture)."""


class ContextOverflowError(PardecError):
    """The prompt (plus what is asked to be generated) does not fit the model's context."""


class InvalidSamplingError(PardecUsageError):
    """A sampling setting out of range: `setting` ("temperature", "top_k", "top_p") must
    satisfy `rule` (">= 0", "in (0, 1]"); `value` is what was given."""

    def __init__(self, setting: str, rule: str, value: object) -> None:
        super().__init__(f"{setting} must be {rule}, got {value}")
        self.setting, self.rule, self.value = setting, rule, value


class CacheRollbackError(PardecError):
    """The model's KV cache cannot be rolled back, so speculative methods cannot run on it.

    `cache_type` names the cache class. Without a `hint`, the remedy (decode without
    drafting: the vanilla method) is worded by the front end that shows the error."""

    def __init__(self, message: str, *, cache_type: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.cache_type = cache_type


class PeerError(PardecError):
    """A peer engine benchmarked against pardec (llama.cpp) is missing, or failed."""


def first_line(exc: BaseException, *, typed: bool = False) -> str:
    """An exception in one line for a message: the first line of its text, or its type's
    name when it has none; `typed` puts the type's name first ("OSError: disk full")."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    if typed:
        return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line or type(exc).__name__
