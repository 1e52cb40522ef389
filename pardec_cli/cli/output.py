"""Terminal output helpers: status lines and statistics on stderr, JSON lines on stdout,
and Ctrl-C handling during generation.

Nothing here draws on a stream that is not a terminal: status lines (and their ANSI
erase codes) appear only when stderr is a TTY, so `pardec ... > out.txt 2> log.txt`
leaves both files clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import IO, Any

import click


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (False for pipes, files, test buffers)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def loading_status(message: str) -> Iterator[None]:
    """Show `message...` on stderr while a slow step runs, only on a terminal; erase it after."""
    tty = is_terminal(sys.stderr)
    if tty:
        click.echo(f"{message}...", err=True, nl=False)
    try:
        yield
    finally:
        if tty:
            click.echo("\r\033[K", err=True, nl=False)


@contextlib.contextmanager
def reader_may_leave() -> Iterator[None]:
    """End quietly, with exit code 0, when the reader of stdout goes away (`pardec gen | head`).

    Writing to a pipe whose reader has exited raises BrokenPipeError (Python ignores
    SIGPIPE). Left alone, Click would turn it into exit code 1; instead the generation
    stops, stdout is pointed at /dev/null so that Python's final flush stays silent, and
    the command exits with 0: the reader took what it wanted.
    """
    try:
        yield
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        raise click.exceptions.Exit(0) from None


def write_json_line(out: IO[str], record: dict[str, Any]) -> None:
    """One JSON object on one line, written in one call and flushed (readers see whole lines)."""
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()


def weights_text(session: Any) -> str:
    """"int8 weights, " for a model with quantized weights, "" for dense ones."""
    weights = getattr(session, "weights", "full")
    return "" if weights == "full" else f"{weights} weights, "


def print_stats(session: Any, stream: Any, *, title: str | None = None) -> None:
    """The `--stats` block, on stderr."""
    where = f"{session.model_name} ({session.dtype}, {weights_text(session)}{session.device}{f', {session.runner} step' if session.compiled else ''})"
    for line in stats_lines(session.method_name, session.proposer.knobs(), where, stream.stats, stream.finish_reason,
                            title=title):
        click.echo(line, err=True)


def stats_lines(method: str, knobs: dict[str, Any], where: str, s: Any, finish_reason: str | None, *,
                title: str | None = None) -> list[str]:
    """The lines of the `--stats` block for one generation (`s`: its GenerationStats)."""
    knob_text = " ".join(f"{k}={v}" for k, v in knobs.items())
    lines = [f"== {title}"] if title else []
    lines += [
        f"method      {method} {knob_text}".rstrip(),
        f"model       {where}",
        f"tokens      {s.prompt_tokens} prompt, {s.generated_tokens} generated ({finish_reason})",
        f"speed       {s.tokens_per_s:.1f} tok/s end to end, {s.decode_tokens_per_s:.1f} tok/s after the first token",
        f"first token {s.ttft_s * 1000:.0f} ms",
        f"steps       {s.steps}, {s.mean_tokens_per_step:.2f} tokens per step, "
        f"{s.acceptance_rate:.0%} of {s.drafted_tokens} drafted tokens accepted",
    ]
    if s.arms:  # a method that switched configurations while decoding (adaptive)
        lines.append(f"switches    {s.switches}")
        for label, arm in s.arms.items():
            rate = arm.tokens / arm.seconds if arm.seconds > 0 else 0.0
            lines.append(f"  {label}: {arm.steps} steps, {arm.tokens / arm.steps:.2f} tokens per step, "
                         f"{arm.seconds:.2f} s, {rate:.1f} tok/s")
    return lines


class InterruptGuard:
    """Ctrl-C while generating: the first press stops after the current decoding step.

    Inside `generating()`, the first SIGINT only sets `requested`; the generation loop
    checks it after every step, so what was generated so far is printed whole (a JSON
    object is never cut in half) and the caller exits with 130. A second press, or a
    press outside `generating()` (model loading, waiting for stdin), raises
    KeyboardInterrupt at once, as usual. Installed only in the main thread, and never
    over an ignored SIGINT (a background job started with `&`).
    """

    def __init__(self) -> None:
        self.requested = False
        self._active = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._active and not self.requested:
            self.requested = True
            return
        self.requested = True
        raise KeyboardInterrupt
