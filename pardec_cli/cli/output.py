"""Terminal output helpers: status lines and statistics, always on stderr."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click


@contextlib.contextmanager
def loading_status(message: str) -> Iterator[None]:
    """Show `message...` on stderr while a slow step runs, only on a terminal; erase it after."""
    tty = sys.stderr.isatty()
    if tty:
        click.echo(f"{message}...", err=True, nl=False)
    try:
        yield
    finally:
        if tty:
            click.echo("\r\033[K", err=True, nl=False)


def print_stats(session: Any, stream: Any) -> None:
    """The `--stats` block."""
    s = stream.stats
    knobs = session.proposer.knobs()
    knob_text = " ".join(f"{k}={v}" for k, v in knobs.items())
    lines = [
        f"method      {session.method_name} {knob_text}".rstrip(),
        f"model       {session.model_name} ({session.dtype}, {session.device})",
        f"tokens      {s.prompt_tokens} prompt, {s.generated_tokens} generated ({stream.finish_reason})",
        f"speed       {s.tokens_per_s:.1f} tok/s end to end, {s.decode_tokens_per_s:.1f} tok/s after the first token",
        f"first token {s.ttft_s * 1000:.0f} ms",
        f"steps       {s.steps}, {s.mean_tokens_per_step:.2f} tokens per step, "
        f"{s.acceptance_rate:.0%} of {s.drafted_tokens} drafted tokens accepted",
    ]
    for line in lines:
        click.echo(line, err=True)
