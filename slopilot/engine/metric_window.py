"""Cheap recorders behind the engine's metrics: histograms and one-minute windows.

The engine loop and the discrete-event simulator call these millions of times, so each
call is a few list operations: no locks, no prometheus_client objects, no allocation.
A /metrics render only reads them, on the server's event loop (there is no scrape
thread: ``metrics_text``), while the engine's thread may be writing them; a render that
races a write sees a value at most one observation old, which is as good as a scrape a
microsecond earlier, and writes each histogram series from one snapshot of its buckets
and sum (``HistogramRecorder.snapshot``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from prometheus_client.utils import floatToGoString

SNAPSHOT_READS = 4
"""Reads of a histogram's counts and sum a render makes at most for one snapshot."""

WINDOW_SLOTS = 60
"""One-second slots kept by the windows: the longest window they can answer for."""


def cumulative_pairs(edges: Sequence[float], counts: Sequence[int]
                     ) -> list[tuple[str, float]]:
    """(le, cumulative count) pairs of bucket ``counts`` (one more than ``edges``, the
    last above every edge), ending with +Inf, as HistogramMetricFamily wants."""
    running = list(accumulate(counts))
    return [*((floatToGoString(e), float(n)) for e, n in zip(edges, running, strict=False)),
            ("+Inf", float(running[-1]))]


class HistogramRecorder:
    """Bucket counts in a plain list; cumulated only when scraped."""

    __slots__ = ("counts", "done", "edges", "total")

    def __init__(self, edges: Sequence[float]) -> None:
        self.edges: tuple[float, ...] = tuple(edges)
        # One slot per edge plus the overflow slot (above the last edge, in +Inf only).
        self.counts: list[int] = [0] * (len(self.edges) + 1)
        self.total = 0.0
        self.done = 0
        """Observations finished: counted, then summed, then this (``snapshot``)."""

    def observe(self, value: float) -> None:
        # Prometheus buckets are "less than or equal": bisect_left finds the first edge >= value.
        self.counts[bisect_left(self.edges, value)] += 1
        self.total += value
        self.done += 1

    def snapshot(self) -> tuple[tuple[int, ...], float]:
        """The bucket counts and the sum of the same observations, read while one thread
        may observe. Read as counts then sum, a scrape's _sum held an observation its
        _count did not (a profile's mean of 12-token outputs read 12.63). Read as
        ``done``, sum, counts: an observation in the sum was finished before ``done`` was
        read, so it is in the counts too; one in the counts but not finished then makes
        them add up to more than ``done``, and the read is made again. One writer a
        recorder (the engine's thread, or the event loop), as everywhere here; a few
        reads at most (a writer observes once between two of them only if the GIL
        switches there), the last one kept: never a render held up by the engine."""
        for _ in range(SNAPSHOT_READS):
            done, total, counts = self.done, self.total, tuple(self.counts)
            if sum(counts) == done:
                break
        return counts, total

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as HistogramMetricFamily wants."""
        return cumulative_pairs(self.edges, self.snapshot()[0])

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
