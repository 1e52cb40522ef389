"""Progress displays for long jobs, drawn with rich on stderr, and only on a terminal.

One shape for every long job (the first-run conversion, `import`, `pull`, `bench`):

    with ProgressDisplay(enabled=progress_wanted(quiet)) as display:
        stage = display.task("converting tensors", total=272)
        for tensor in tensors:
            ...
            stage.advance()

A disabled display draws nothing and costs nothing, so library code can report progress
unconditionally; whether anything appears is the caller's choice (`progress_wanted`:
stderr is a terminal, and no --quiet/--json asked for clean output). The display writes
to the stderr it found when it started, so code that silences ``sys.stderr`` meanwhile
(transformers' own bars) does not hide it. rich is imported only when a display is on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

# A stage report from code that knows nothing about displays:
# (stage description, units done, units in all or None when unknown).
StageReport = Callable[[str, int, "int | None"], None]


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (False for pipes, files, test buffers)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def progress_wanted(quiet: bool = False) -> bool:
    """Draw progress: on a terminal, unless the user asked for quiet (or JSON) output."""
    return not quiet and stderr_is_terminal()


class Task:
    """One line of a display: a bar with a count (or bytes), or a spinner when the total is unknown."""

    def __init__(self, display: ProgressDisplay, task_id: Any) -> None:
        self._display, self._id = display, task_id

    def advance(self, amount: float = 1) -> None:
        if self._display._progress is not None:
            self._display._progress.advance(self._id, amount)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:  # fmt: skip
        if self._display._progress is not None:
            fields: dict[str, Any] = {}
            if completed is not None:
                fields["completed"] = completed
            if total is not None:
                fields["total"] = total
            if description is not None:
                fields["description"] = description
            self._display._progress.update(self._id, **fields)

    def add_total(self, amount: float) -> None:
        """Grow the total (an overall bar whose parts become known one by one)."""
        progress = self._display._progress
        if progress is not None:
            task = progress.tasks[[t.id for t in progress.tasks].index(self._id)]
            progress.update(self._id, total=(task.total or 0) + amount)

    def done(self, *, remove: bool = True) -> None:
        """Finish the line; by default it disappears (the command prints its own result)."""
        progress = self._display._progress
        if progress is not None:
            if remove:
                progress.remove_task(self._id)
            else:
                task = progress.tasks[[t.id for t in progress.tasks].index(self._id)]
                progress.update(self._id, completed=task.total or task.completed)


class ProgressDisplay:
    """A live display of tasks on stderr (rich), or nothing when not `enabled`.

    `transfer` shows bytes, speed and time left (downloads); otherwise a count
    ("12/30"), the time spent and the time left. The display is transient: it is erased
    when the job ends, and the command's own result stays the only output.
    """

    def __init__(self, enabled: bool, *, transfer: bool = False) -> None:
        self.enabled = enabled
        self.transfer = transfer
        self._progress: Any = None

    def __enter__(self) -> ProgressDisplay:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        amount = [DownloadColumn(), TransferSpeedColumn()] if self.transfer else [MofNCompleteColumn()]
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(bar_width=30), TaskProgressColumn(),
            *amount, TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(file=sys.stderr, force_terminal=True), transient=True, redirect_stdout=False, redirect_stderr=True,
        )  # fmt: skip
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def task(self, description: str, total: float | None = None) -> Task:
        """A new line: a bar when `total` is known, a spinner while it is None."""
        task_id = self._progress.add_task(description, total=total) if self._progress is not None else None
        return Task(self, task_id)

    def print(self, message: str) -> None:
        """A line above the live display (or plainly on stderr when there is none)."""
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=sys.stderr, flush=True)

    def stages(self) -> StageReport:
        """A `StageReport` that shows each stage as its own line, the previous one ended."""
        current: dict[str, Any] = {}

        def report(stage: str, done: int, total: int | None) -> None:
            if current.get("name") != stage:
                if "task" in current:
                    current["task"].done()
                current["name"], current["task"] = stage, self.task(stage, total)
            current["task"].update(completed=done, total=total)

        return report
