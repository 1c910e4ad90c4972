"""Timers that fire when the test says, not when the wall clock does.

``FiredTimers`` is a ``slopilot.tuner.prometheus.bounded.StartTimer``: a request's
deadline built on it runs out when the test has seen what should end it (an answer
dripping), however long a busy machine took to get there, and never under a request that
is merely slow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class FiredTimer:
    """One timer: armed until cancelled or fired."""

    def __init__(self, owner: FiredTimers, delay_s: float,
                 callback: Callable[[], None]) -> None:
        self.owner, self.delay_s, self.callback = owner, delay_s, callback

    def cancel(self) -> None:
        self.owner._disarm(self)

    def fire(self) -> None:
        """Run out now (as the wall clock would at ``delay_s``), unless cancelled."""
        if self.owner._disarm(self):
            self.callback()


class FiredTimers:
    """Starts ``FiredTimer`` s and keeps the armed ones, in the order they started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[FiredTimer] = []

    def __call__(self, delay_s: float, callback: Callable[[], None]) -> FiredTimer:
        timer = FiredTimer(self, delay_s, callback)
        with self._lock:
            self._armed.append(timer)
        return timer

    def armed(self) -> list[FiredTimer]:
        with self._lock:
            return list(self._armed)

    def _disarm(self, timer: FiredTimer) -> bool:
        with self._lock:
            if timer not in self._armed:
                return False
            self._armed.remove(timer)
            return True
