"""How long a client turned away with 429 should wait: the ``Retry-After`` header.

A fixed second makes every rejected client come back at once, into a queue that has
not moved. The estimate here is the time the current backlog needs to get through:
waiting requests divided by the rate at which requests have been leaving the queue
(their first token, over the last ``window_s``), clamped to ``[lo_s, hi_s]``. With no
request through in the window (a stalled or new engine) it answers ``unknown_s``.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from slopilot.engine.engine import LLMEngine
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request


class RetryAfter:
    """Engine observer (engine thread) with a ``seconds`` query (any thread)."""

    def __init__(self, *, window_s: float = 30.0, lo_s: int = 1, hi_s: int = 60,
                 unknown_s: int = 5) -> None:
        if not window_s > 0 or not 1 <= lo_s <= unknown_s <= hi_s:
            raise ValueError(f"window_s={window_s!r}, lo_s={lo_s!r}, unknown_s={unknown_s!r}, "
                             f"hi_s={hi_s!r}: need window_s > 0 and 1 <= lo_s <= unknown_s "
                             "<= hi_s")
        self.window_s, self.lo_s, self.hi_s, self.unknown_s = window_s, lo_s, hi_s, unknown_s
        self._lock = threading.Lock()
        self._through: deque[float] = deque()

    def _trim(self, now: float) -> None:
        while self._through and self._through[0] <= now - self.window_s:
            self._through.popleft()

    def seconds(self, waiting: int, now: float) -> int:
        """Whole seconds until ``waiting`` requests would have left the queue."""
        with self._lock:
            self._trim(now)
            through = len(self._through)
            if through == 0:
                return self.unknown_s
            # The rate over the time the window really spans (a young engine's is short).
            rate = through / max(now - self._through[0], 1.0)
        return int(min(self.hi_s, max(self.lo_s, math.ceil(max(waiting, 1) / rate))))

    # ------------------------------------------------------------------ observer
    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        with self._lock:
            self._through.append(now)
            self._trim(now)

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        pass

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        pass

    def on_finished(self, req: Request, now: float) -> None:
        pass
