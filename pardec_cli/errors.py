"""Errors that reach the user as one clear line (never a traceback).

The CLI catches `PardecError`, prints `pardec: error: <message>` (plus the hint on a
second line when there is one) to stderr and exits with `exit_code`.
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


class CacheRollbackError(PardecError):
    """The model's KV cache cannot be rolled back, so speculative methods cannot run on it."""


class PeerError(PardecError):
    """A peer engine benchmarked against pardec (llama.cpp) is missing, or failed."""
