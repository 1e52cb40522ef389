"""A one-line progress report: redrawn in place on a terminal, an occasional plain line elsewhere."""

from __future__ import annotations

from time import perf_counter
from typing import TextIO


def clock(seconds: float) -> str:
    """62.5 -> '1:02'; 3700 -> '1:01:40'."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressLine:
    """`show(text)` redraws one status line on a terminal; in a pipe or a log it prints a
    line at most every `every_s` seconds (and `final` lines always), never ANSI codes."""

    def __init__(self, stream: TextIO, *, terminal: bool, every_s: float = 30.0) -> None:
        self.stream, self.terminal, self.every_s = stream, terminal, every_s
        self._last = -1e9
        self._drawn = False

    def show(self, text: str, *, final: bool = False) -> None:
        now = perf_counter()
        if self.terminal:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
            self._drawn = not final
        elif final or now - self._last >= self.every_s:
            self.stream.write(text + "\n")
            self._last = now
        self.stream.flush()

    def clear(self) -> None:
        """End a redrawn line (before printing anything else)."""
        if self.terminal and self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False
