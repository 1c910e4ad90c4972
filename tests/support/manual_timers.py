"""A ``loop.call_later`` whose time moves only when a test says (``advance``): deadlines
driven by it fire in order and at exactly their due time, whatever the machine's speed.

Call it and advance it on one thread: the event loop's, where the protocols arm them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ManualTimer:
    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ManualTimers:
    """A ``call_later`` whose time moves only when the test says."""

    now: float = 0.0
    pending: list[ManualTimer] = field(default_factory=list)

    def call_later(self, delay: float, callback: Callable[[], None]) -> ManualTimer:
        timer = ManualTimer(self.now + delay, callback)
        self.pending.append(timer)
        return timer

    def advance(self, to: float) -> None:
        """Time moves to ``to``: the timers due by then fire, in order."""
        while due := sorted((t for t in self.pending if not t.cancelled and t.due <= to),
                            key=lambda t: t.due):
            timer = due[0]
            self.pending.remove(timer)
            self.now = timer.due
            timer.callback()
        self.now = to
