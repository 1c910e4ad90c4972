"""A trace's arrivals that a gap dwarfing the rest sets apart: a stray time, refused.

One row whose time is a missing value logged as 0, among epoch seconds (1.7e9), reads
as a trace of 54 years: ``--target-rate`` then squeezes the real requests into an
instant (a wrong verdict, said nowhere), and the whole-trace check walked its sliding
windows over the span. Found while the trace is read (``trace.read_trace``), where each
arrival's line is known, and refused where it is replayed (``TraceSpec.records``), only
when the replayed cut holds both sides of the gap: the window the error names then
replays the rest.

Not a long quiet period: a gap is stray only past ``STRAY_GAP_S`` and either
``STRAY_RATIO`` times what the other arrivals span, or past ``ANY_GAP_S`` whatever they
span. A night's pause (hours), BurstGPT's 121 days of daily traffic, or two day-long
captures weeks apart pass.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slopilot.engine.sim.trace_fields import TraceError

if TYPE_CHECKING:
    from slopilot.engine.sim.trace_formats import TraceRecord

STRAY_GAP_S = 1e6
"""About 11.6 days: shorter gaps are pauses, however quiet the trace around them."""
STRAY_RATIO = 100.0
ANY_GAP_S = 1e8
"""About 3.2 years: no trace replays years of nothing, whatever it spans besides."""
_SHOWN_LINES = 5
_SLICE = 1 << 16
_YEAR_S = 31_556_952.0
_EPOCH_LIKE = 1e8  # a time past this reads as epoch seconds (1973 on): shown as a date


@dataclass(frozen=True, slots=True)
class StrayGap:
    """The trace's largest gap, where it dwarfs the rest; refused for a cut holding both
    sides."""

    after: int
    """The place in the trace (``TraceRecord.index``) of the last arrival before it."""
    message: str

    def refuse(self, picked: Sequence[TraceRecord]) -> None:
        """Raise where ``picked`` (a window of the trace, in arrival order) spans it."""
        if not picked:
            return
        first, last = picked[0].index, picked[-1].index
        if first is not None and last is not None and first <= self.after < last:
            raise TraceError(self.message)


def stray_gap(records: Sequence[TraceRecord], lines: Sequence[int],
              label: str) -> StrayGap | None:
    """The stray gap among the arrivals of ``records`` (in the order read, each row's
    line in ``lines``), or None."""
    n = len(records)
    if n < 2:
        return None
    # One array of 8 bytes a row, sorted in place, its gaps taken a slice at a time: the
    # read's peak (the records) is not raised by copies of it. The order, with the
    # times again, only when refused.
    s = _times(records)
    s.sort()
    gap, i = -1.0, 0  # the largest gap, after the arrival at sorted place i
    for a in range(0, n - 1, _SLICE):
        gaps = np.diff(s[a:a + _SLICE + 1])
        k = int(np.argmax(gaps))
        if gaps[k] > gap:
            gap, i = float(gaps[k]), a + k
    rest = float(s[-1] - s[0]) - gap
    if not (gap > STRAY_GAP_S and (gap > STRAY_RATIO * rest or gap > ANY_GAP_S)):
        return None
    order = np.argsort(_times(records), kind="stable")  # the order read_trace sorts in
    before = i + 1 <= n - (i + 1)  # the stray side is the smaller one
    side = order[:i + 1] if before else order[i + 1:]
    side_lines = sorted(int(lines[k]) for k in side)
    at = s[:i + 1] if before else s[i + 1:]
    k = len(side_lines)
    if k == 1:
        which = f"this arrival ({_time(float(at[0]))})"
        verb = "is"
    else:
        shown = ", ".join(str(x) for x in side_lines[:_SHOWN_LINES])
        more = f" and {k - _SHOWN_LINES:,} more" if k > _SHOWN_LINES else ""
        which = (f"lines {shown}{more} ({k:,} arrivals, {_time(float(at[0]))} to "
                 f"{_time(float(at[-1]))})")
        verb = "are"
    where = ("before the next arrival" if before else "after the arrival before "
             + ("it" if k == 1 else "them"))
    if before:
        cut = f"{math.floor(float(s[i + 1] - s[0])):.0f}:"
    else:
        cut = f"0:{math.floor(float(s[i] - s[0])) + 1:.0f}"
    rows = "row" if k == 1 else "rows"
    message = (
        f"{label}:{side_lines[0]}: {which} {verb} {gap:,.0f} s ({_long(gap)}) {where}, "
        f"while the other {n - k:,} arrivals span {_short(rest)} s: replayed whole, the "
        f"trace would last {_long(float(s[-1] - s[0]))}, mostly nothing (with a target "
        "rate, the real requests squeezed into an instant). A stray time, such as a "
        f"missing value logged as 0? Drop the {rows}, or replay the rest with "
        f"--trace-window {cut} (seconds from the trace's first arrival)")
    return StrayGap(int(i), message)


def _times(records: Sequence[TraceRecord]) -> np.ndarray:
    return np.fromiter((r.arrival_time for r in records), np.float64, len(records))


def _time(t: float) -> str:
    if t < _EPOCH_LIKE:
        return f"time {_short(t)} s"
    date = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return f"time {_short(t)} s, {date:%Y-%m-%d %H:%M:%S} UTC"


def _short(x: float) -> str:
    return f"{x:,.3f}".rstrip("0").rstrip(".")


def _long(seconds: float) -> str:
    if seconds >= 2 * _YEAR_S:
        return f"{seconds / _YEAR_S:,.0f} years"
    return f"{seconds / 86400:,.1f} days"
