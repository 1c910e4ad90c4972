"""What a cut of a trace (``--trace-window``, a scenario's ``start_s``/``end_s`` or
``max_requests``) leaves out, where that is busier than what it keeps.

A cut is the user's to choose, but one that keeps a quiet start of a trace whose burst
comes later is judged on the quiet part only: its verdict says nothing of the burst, and
nothing said so (a cut to the first 540 s of a trace quiet until 600 s held on one
replica, where the whole trace needs two). ``simulate`` and ``tune`` warn of it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from slopilot.engine.sim.distribution_spec import read_cached
from slopilot.engine.sim.trace import window
from slopilot.engine.sim.workload_spec import TraceSpec

MINUTE_S = 60.0


@dataclass(frozen=True)
class LeftOut:
    """A cut's left-out requests, and the busiest minute among them against the kept."""

    cut: str
    """The cut as the user gave it: ``--trace-window 0:540``."""
    requests: int
    of: int
    busiest_at_s: float
    """Where the busiest left-out minute starts, in the trace's own seconds."""
    busiest: int
    """Arrivals in that minute (left-out ones only)."""
    kept_busiest: int
    """Arrivals in the busiest minute the cut keeps."""

    def text(self) -> str:
        return (f"{self.cut}: leaves out {self.requests:,} of the trace's {self.of:,} "
                f"requests, among them a busier minute than any it keeps "
                f"({self.busiest_at_s:,.0f}-{self.busiest_at_s + MINUTE_S:,.0f} s of the "
                f"trace: {self.busiest:,} arrivals, against {self.kept_busiest:,} in the "
                "busiest minute kept); a verdict on the cut may not hold on the whole "
                "trace: widen the window to take that minute in, or leave the cut out")


def cut_label(spec: TraceSpec, start_s: float | None, end_s: float | None) -> str:
    """The cut as the user gave it: ``--trace-window`` (its ``start_s``, ``end_s``; both
    None where it was not given), or the scenario's own fields."""
    if start_s is not None or end_s is not None:
        lo = "" if start_s is None else f"{start_s:g}"
        hi = "" if end_s is None else f"{end_s:g}"
        return f"--trace-window {lo}:{hi}"
    parts = [f"start_s {spec.start_s:g}"] if spec.start_s else []
    parts += [] if spec.end_s is None else [f"end_s {spec.end_s:g}"]
    parts += [] if spec.max_requests is None else [f"max_requests {spec.max_requests}"]
    return f"the scenario's trace cut ({', '.join(parts)})"


def busiest_minute(times: list[float]) -> tuple[float, int]:
    """The start of the minute with the most of the sorted ``times`` in it, and how many;
    (0.0, 0) for none. Each minute starts at an arrival (the busiest one always can)."""
    best_at, best = 0.0, 0
    for i, t in enumerate(times):
        n = bisect.bisect_left(times, t + MINUTE_S, lo=i) - i
        if n > best:
            best_at, best = t, n
    return best_at, best


def left_out(spec: TraceSpec, cut: str) -> LeftOut | None:
    """What ``spec``'s cut leaves out, where its busiest minute outside the cut has more
    arrivals than any minute inside; None for an uncut trace or a cut that keeps its
    busiest minute."""
    if spec.start_s == 0.0 and spec.end_s is None and spec.max_requests is None:
        return None
    whole = read_cached(spec.trace, spec.fmt, spec.model)
    kept = window(whole, start_s=spec.start_s, end_s=spec.end_s,
                  max_requests=spec.max_requests)
    kept_ids = {r.index for r in kept}  # each record's place in the whole trace
    outside = [r.arrival_time for r in whole if r.index not in kept_ids]
    if not outside:
        return None
    at, busiest = busiest_minute(sorted(outside))
    _, inside = busiest_minute(sorted(r.arrival_time for r in kept))
    if busiest <= inside:
        return None
    return LeftOut(cut, len(outside), len(whole), at, busiest, inside)
