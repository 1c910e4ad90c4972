"""Cheap recorders behind the engine's metrics: histograms and one-minute windows.

The engine loop and the discrete-event simulator call these millions of times, so each
call is a few list operations: no locks, no prometheus_client objects, no allocation.
A /metrics render only reads them, on the server's event loop (there is no scrape
thread: ``metrics_text``), while the engine's thread may be writing them; a render that
races a write sees a value at most one observation old, which is as good as a scrape a
microsecond earlier, and writes each histogram series from one snapshot of its counts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

WINDOW_SLOTS = 60
"""One-second slots kept by the windows: the longest window they can answer for."""


class HistogramRecorder:
    """Bucket counts in a plain list; cumulated only when scraped."""

    __slots__ = ("counts", "edges", "total")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges: tuple[float, ...] = tuple(edges)
        # One slot per edge plus the overflow slot (above the last edge, in +Inf only).
        self.counts: list[int] = [0] * (len(self.edges) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": bisect_left finds the first edge >= value.
        self.counts[bisect_left(self.edges, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as HistogramMetricFamily wants."""
        out: list[tuple[str, float]] = []
        running = 0
        counts = list(self.counts)
        for edge, count in zip(self.edges, counts, strict=False):
            running += count
            out.append((floatToGoString(edge), float(running)))
        out.append(("+Inf", float(running + counts[-1])))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


class SlidingMax:
    """Largest value seen over the last ``window_s`` seconds, in one-second slots."""

    __slots__ = ("_epoch", "_max", "window_s")

    def __init__(self, window_s: float = 60.0) -> None:
        if not 1 <= window_s <= WINDOW_SLOTS:
            raise ValueError(f"window_s={window_s}: must be in [1, {WINDOW_SLOTS}] seconds")
        self.window_s = window_s
        self._epoch = [-1] * WINDOW_SLOTS
        self._max = [0.0] * WINDOW_SLOTS

    def add(self, value: float, now: float) -> None:
        second = int(now)
        i = second % WINDOW_SLOTS
        if self._epoch[i] != second:
            self._epoch[i] = second
            self._max[i] = value
        elif value > self._max[i]:
            self._max[i] = value

    def value(self, now: float) -> float:
        oldest = now - self.window_s
        best = 0.0
        for epoch, value in zip(self._epoch, self._max, strict=True):
            if oldest < epoch + 1 and epoch <= now and value > best:
                best = value
        return best


class SlidingSum:
    """Sum of values added over the last ``window_s`` seconds, in one-second slots."""

    __slots__ = ("_epoch", "_first", "_sum", "window_s")

    def __init__(self, window_s: float = 30.0) -> None:
        if not 1 <= window_s <= WINDOW_SLOTS:
            raise ValueError(f"window_s={window_s}: must be in [1, {WINDOW_SLOTS}] seconds")
        self.window_s = window_s
        self._epoch = [-1] * WINDOW_SLOTS
        self._sum = [0.0] * WINDOW_SLOTS
        self._first: float | None = None

    def add(self, value: float, now: float) -> None:
        if self._first is None:
            self._first = now - value
        second = int(now)
        i = second % WINDOW_SLOTS
        if self._epoch[i] != second:
            self._epoch[i] = second
            self._sum[i] = value
        else:
            self._sum[i] += value

    def ratio(self, now: float) -> float:
        """The windowed sum over the window's length (or the time since the first add)."""
        if self._first is None:
            return 0.0
        oldest = now - self.window_s
        total = 0.0
        for epoch, value in zip(self._epoch, self._sum, strict=True):
            if oldest < epoch + 1 and epoch <= now:
                # The slot the window's edge cuts counts for the part inside the window.
                total += value * min(1.0, epoch + 1 - oldest)
        span = min(self.window_s, now - self._first)
        if span <= 0:
            return 0.0
        # Whole-second slots and a step counted in the second it ended can push it past 1.
        return min(1.0, total / span)
