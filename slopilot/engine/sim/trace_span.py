"""A trace's arrivals that a gap dwarfing the rest sets apart: a stray time, refused.

One row whose time is a missing value logged as 0, among epoch seconds (1.7e9), reads
as a trace of 54 years: ``--target-rate`` then squeezes the real requests into an
instant (a wrong verdict, said nowhere), and the whole-trace check walked its sliding
windows over the span. Found while the trace is read (``trace.read_trace``), where each
arrival's line is known, and refused where it is replayed (``TraceSpec.records``), only
when the replayed cut holds both sides of such a gap: the window the error names then
replays the rest.

Not a long quiet period: a gap is stray only past ``STRAY_GAP_S`` and either
``STRAY_RATIO`` times what the other arrivals of its part span, or past ``ANY_GAP_S``
whatever they span. A night's pause (hours), BurstGPT's 121 days of daily traffic, or two
day-long captures weeks apart pass. The two sides of a stray gap are judged again, each on
its own, so that a 0 before the trace and a time decades after it are both found, and the
window named holds neither. Where one part holds the trace and the others a handful of
rows, those rows are named; where several parts hold many, none is called stray (700 rows
at 0 are not the trace's 600 real ones' strays, nor the other way round): each part's
window is offered.
"""

from __future__ import annotations

import datetime
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
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
_SHOWN_PARTS = 3
HANDFUL = 5
MAX_WIDE = 1000
"""Gaps past ``STRAY_GAP_S`` judged one by one; more are decades of gaps, not a trace."""
"""A side of a gap with at most this many arrivals (or a thousandth of the trace) is
the stray one; where more than one part is bigger, none is called stray."""
_SLICE = 1 << 16
_YEAR_S = 31_556_952.0
_EPOCH_LIKE = 1e8  # a time past this reads as epoch seconds (1973 on): shown as a date


@dataclass(frozen=True, slots=True)
class StrayGap:
    """The gaps that dwarf the rest of a trace; refused for a cut holding both sides of
    any of them."""

    afters: tuple[int, ...]
    """For each gap, in order, the place in the trace (``TraceRecord.index``) of the last
    arrival before it."""
    message: str

    def refuse(self, picked: Sequence[TraceRecord]) -> None:
        """Raise where ``picked`` (a window of the trace, in arrival order) spans one."""
        if not picked:
            return
        first, last = picked[0].index, picked[-1].index
        if first is None or last is None:
            return
        k = bisect_left(self.afters, first)
        if k < len(self.afters) and self.afters[k] < last:
            raise TraceError(self.message)


@dataclass(frozen=True, slots=True)
class _Part:
    """Arrivals ``lo..hi`` (sorted places) that no stray gap splits."""

    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo + 1


def stray_gap(records: Sequence[TraceRecord], lines: Sequence[int],
              label: str) -> StrayGap | None:
    """The stray gaps among the arrivals of ``records`` (in the order read, each row's
    line in ``lines``), or None."""
    n = len(records)
    if n < 2:
        return None
    # One array of 8 bytes a row, sorted in place, its gaps taken a slice at a time: the
    # read's peak (the records) is not raised by copies of it. The order, with the
    # times again, only when refused.
    s = _times(records)
    s.sort()
    wide: list[tuple[int, float]] = []  # (place before it, gap) of gaps past STRAY_GAP_S
    for a in range(0, n - 1, _SLICE):
        gaps = np.diff(s[a:a + _SLICE + 1])
        for k in np.flatnonzero(gaps > STRAY_GAP_S)[:MAX_WIDE + 1 - len(wide)]:
            wide.append((a + int(k), float(gaps[k])))
    if not wide:
        return None
    if len(wide) > MAX_WIDE:
        return StrayGap(*_too_wide(s, label))
    afters = _split(s, wide)
    if not afters:
        return None
    order = np.argsort(_times(records), kind="stable")  # the order read_trace sorts in
    bounds = [0, *(i + 1 for i in afters), n]
    parts = [_Part(bounds[j], bounds[j + 1] - 1) for j in range(len(bounds) - 1)]
    return StrayGap(tuple(afters), _message(s, parts, order, lines, label))


def _too_wide(s: np.ndarray, label: str) -> tuple[tuple[int, ...], str]:
    """More gaps past ``STRAY_GAP_S`` than ``MAX_WIDE``, decades of them: not seconds, or
    not times. Every such gap is refused (no cut of it is a trace to replay)."""
    gaps = np.diff(s)
    afters = tuple(int(k) for k in np.flatnonzero(gaps > STRAY_GAP_S))
    return afters, (
        f"{label}: {len(afters):,} gaps between arrivals are longer than "
        f"{_long(STRAY_GAP_S)}, and the trace spans {_long(float(s[-1] - s[0]))}: are "
        "its times seconds (or milliseconds, or row numbers)? Give arrival times in "
        "seconds, or dates")


def _split(s: np.ndarray, wide: list[tuple[int, float]]) -> list[int]:
    """The places after which a stray gap falls: a part's widest gap is stray while it
    dwarfs what the part spans besides (``STRAY_RATIO``) or is past ``ANY_GAP_S``; the
    two sides are then judged again, each on its own. Only gaps past ``STRAY_GAP_S`` can
    be, so only those are looked at (a handful in a real trace)."""
    out: list[int] = []
    todo = [(0, len(s) - 1, wide)]
    while todo:
        lo, hi, inside = todo.pop()
        if not inside:
            continue
        i, gap = max(inside, key=lambda w: w[1])
        rest = float(s[hi] - s[lo]) - gap
        if not (gap > STRAY_RATIO * rest or gap > ANY_GAP_S):
            continue  # the widest is a pause of this part: a narrower one is too
        out.append(i)
        todo.append((lo, i, [w for w in inside if w[0] < i]))
        todo.append((i + 1, hi, [w for w in inside if w[0] > i]))
    return sorted(out)


def _message(s: np.ndarray, parts: list[_Part], order: np.ndarray, lines: Sequence[int],
             label: str) -> str:
    n = len(s)
    whole = (f"replayed whole, the trace would last {_long(float(s[-1] - s[0]))}, mostly "
             "nothing (with a target rate, the real requests squeezed into an instant)")
    big = [p for p in parts if p.count > max(HANDFUL, n // 1000)]
    if len(big) == 1:
        return _stray_rows(s, parts, big[0], order, lines, label, whole)
    # Several parts of many arrivals each (or none): which is the trace, which the stray,
    # is not for the count to say. Each is offered.
    offered = big or sorted(parts, key=lambda p: -p.count)[:2]
    said = "; ".join(
        f"{p.count:,} arrivals from line {_first_line(order, lines, p.lo, p.hi)} "
        f"({_during(s, p)}): --trace-window {_cut(s, p)}" for p in offered[:_SHOWN_PARTS])
    more = (f" ({len(parts) - min(len(offered), _SHOWN_PARTS):,} more parts not shown)"
            if len(parts) > min(len(offered), _SHOWN_PARTS) else "")
    widest = max(float(s[q.lo] - s[p.hi]) for p, q in pairwise(parts))
    return (f"{label}: gaps of up to {widest:,.0f} s ({_long(widest)}) split the trace "
            f"into {len(parts):,} parts: {whole}. Times from two sources, or captures "
            f"far apart? Replay one part: {said}{more} (seconds from the trace's first "
            "arrival)")


def _stray_rows(s: np.ndarray, parts: list[_Part], main: _Part, order: np.ndarray,
                lines: Sequence[int], label: str, whole: str) -> str:
    n = len(s)
    side = np.concatenate([order[:main.lo], order[main.hi + 1:]])
    side_lines = sorted(int(lines[k]) for k in side)
    k = len(side_lines)
    near = min([float(s[main.lo] - s[main.lo - 1])] if main.lo > 0 else [],
               default=math.inf)
    if main.hi < n - 1:
        near = min(near, float(s[main.hi + 1] - s[main.hi]))
    if k == 1:
        at = float(s[0] if main.lo > 0 else s[-1])
        which, verb = f"this arrival ({_time(at)})", "is"
    else:
        shown = ", ".join(str(x) for x in side_lines[:_SHOWN_LINES])
        more = f" and {k - _SHOWN_LINES:,} more" if k > _SHOWN_LINES else ""
        which = f"lines {shown}{more} ({k:,} arrivals)"
        verb = "are"
    rows = "row" if k == 1 else "rows"
    span = float(s[main.hi] - s[main.lo])
    return (f"{label}:{side_lines[0]}: {which} {verb} {near:,.0f} s ({_long(near)}) or "
            f"more from the other {main.count:,} arrivals, which span {_short(span)} s: "
            f"{whole}. A stray time, such as a missing value logged as 0? Drop the "
            f"{rows}, or replay the rest with --trace-window {_cut(s, main)} (seconds "
            "from the trace's first arrival)")


def _cut(s: np.ndarray, part: _Part) -> str:
    """The ``--trace-window`` that replays ``part`` alone: a stray gap is far wider than
    the second rounded off either end."""
    start = "0" if part.lo == 0 else f"{math.floor(float(s[part.lo] - s[0])):.0f}"
    end = "" if part.hi == len(s) - 1 else f"{math.floor(float(s[part.hi] - s[0])) + 1:.0f}"
    return f"{start}:{end}"


def _during(s: np.ndarray, part: _Part) -> str:
    first, last = float(s[part.lo]), float(s[part.hi])
    return f"all at {_time(first)}" if first == last else f"{_time(first)} to {_time(last)}"


def _first_line(order: np.ndarray, lines: Sequence[int], lo: int, hi: int) -> int:
    return min(int(lines[k]) for k in order[lo:hi + 1])


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
