"""How often the generation worker may hand an update to the UI.

The decoding thread and the UI thread share one interpreter lock. Every update costs
the UI thread Python work (Markdown parsing, layout, rendering: about 30 ms of CPU per
update measured on a 2-core CPU, more in a long transcript), and while the UI thread
holds the lock the decoding thread stalls between its torch calls (a Python thread kept
busy next to the decoder cut its tokens/s about 3x in the same measurement; at a fixed
15 Hz, 30 ms updates would keep the UI busy half the time). So the pace adapts: after
each update the UI measures the CPU time its thread spent since the previous one, and
the next update may come only after `cost / UI_SHARE` seconds (never sooner than
`MIN_INTERVAL_S`), which keeps the UI's share of the time near `UI_SHARE` whatever the
transcript length or the terminal. The worker also waits until the UI has taken the
previous update, so updates never queue.
"""

from __future__ import annotations

import threading
import time

MIN_INTERVAL_S = 1 / 15  # at most 15 updates a second, when updates are cheap
MAX_INTERVAL_S = 1.0  # at least one update a second, however costly
UI_SHARE = 0.03  # the UI thread's target share of the time while a reply streams


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
