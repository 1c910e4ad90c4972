"""One collection listed, then watched from the listing's version, listed again after a
backoff where its watch ends at once, as client-go's reflector does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

RELIST_FIRST_S = 1.0
"""The wait before listing again after a watch that ended at once with no event..."""
RELIST_CAP_S = 30.0
"""...doubled at each such watch up to this; a watch that told an event or lived this long
resets it."""


@dataclass
class _Relist:
    """The backoff before listing again after watches that ended at once, told nothing."""

    clock: Callable[[], float]
    delay_s: float = 0.0

    def after(self, began: float, events: int) -> float:
        """The wait before the next LIST, after a watch that began at ``began``."""
        if events or self.clock() - began >= RELIST_CAP_S:
            self.delay_s = 0.0
        else:
            self.delay_s = min(self.delay_s * 2, RELIST_CAP_S) or RELIST_FIRST_S
        return self.delay_s


def _pause(stop: threading.Event, wait_s: float) -> None:
    if wait_s:  # the stop's own wait: the stop ends it
        stop.wait(wait_s)
