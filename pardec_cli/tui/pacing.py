"""How often the generation worker may hand an update to the UI.

The decoding thread and the UI thread share one interpreter lock and, on a small CPU,
the cores: on 2 cores that run the model's two compute threads, a millisecond of UI
work costs close to a millisecond of decoding (a Python thread kept busy next to the
decoder cut its tokens/s about 3x). Every update costs the UI thread Markdown parsing,
layout and rendering: 30-60 ms of CPU per update measured on these 2 cores at 120x40,
more in a long transcript or a bigger terminal, much less on a fast desktop CPU. So the
UI's share of the time is the chat's slowdown against `pardec gen`, and the pace is set
by cost, not by a fixed rate: after each update the UI measures the CPU time its thread
spent since the previous one, and the next update may come only after `cost / UI_SHARE`
seconds (never sooner than `MIN_INTERVAL_S`, never later than `MAX_INTERVAL_S`). That
keeps the UI near `UI_SHARE` of the time whatever the transcript length or the
terminal: about an update a second and a half on these 2 cores, many a second where
drawing is cheap. The worker also waits until the UI has taken the previous update, so
updates never queue.
"""

from __future__ import annotations

import threading
import time

MIN_INTERVAL_S = 1 / 15  # at most 15 updates a second, when updates are cheap
MAX_INTERVAL_S = 1.5  # an update at least every 1.5 s, however costly
UI_SHARE = 0.02  # the UI thread's target share of the time while a reply streams


class UpdatePacer:
    """Shared by the worker (`may_send`, `sent`) and the UI thread (`taken`)."""

    def __init__(self) -> None:
        self._idle = threading.Event()  # set while the UI has no update pending
        self._idle.set()
        self._not_before = 0.0  # time.monotonic() before which no update is sent
        self._ui_cpu = time.thread_time()  # the UI thread's CPU clock at the last update

    def may_send(self, now: float) -> bool:
        """Worker side: may an update be posted now?"""
        return now >= self._not_before and self._idle.is_set()

    def sent(self) -> None:
        """Worker side: an update was posted."""
        self._idle.clear()

    def taken(self) -> None:
        """UI side, after applying an update: set the pace from what the UI thread spent."""
        cpu = time.thread_time()
        cost, self._ui_cpu = cpu - self._ui_cpu, cpu
        interval = min(max(cost / UI_SHARE, MIN_INTERVAL_S), MAX_INTERVAL_S)
        self._not_before = time.monotonic() + interval
        self._idle.set()

    def reset(self) -> None:
        """UI side, before a generation starts."""
        self._ui_cpu = time.thread_time()
        self._not_before = 0.0
        self._idle.set()
