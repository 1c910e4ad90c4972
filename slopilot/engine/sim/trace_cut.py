"""What a cut of a trace (``--trace-window``, a scenario's ``start_s``/``end_s`` or
``max_requests``) leaves out, where that is busier than what it keeps.

A cut is the user's to choose, but one that keeps a quiet start of a trace whose burst
comes later is judged on the quiet part only: its verdict says nothing of the burst, and
nothing said so (a cut to the first 540 s of a trace quiet until 600 s held on one
replica, where the whole trace needs two). ``simulate`` and ``tune`` warn of it.

A minute is busier by its arrivals or by its tokens (prompt plus output, less the prompt
tokens an earlier request sent as the same prefix: ``prefix_reuse.fresh_tokens``, the
measure of the study's "busiest tokens" window, ``windows.py``). Counting arrivals
alone missed a short heavy burst: 100 prompts of 6,000 tokens within 3 s, fewer arrivals
than any minute of the 2 req/s of 500-token prompts kept, and ten times their tokens; the
cut held on one replica, where the whole trace held on none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from slopilot.engine.sim.distribution_spec import read_cached
from slopilot.engine.sim.prefix_reuse import fresh_tokens
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
    measure: Literal["arrivals", "tokens"]
    """What the minute is busier by: of the two, the one it passes the kept by most."""
    busiest_at_s: float
    """Where the busiest left-out minute starts, in the trace's own seconds."""
    busiest: float
    """Its ``measure`` in that minute (left-out requests only)."""
    kept_busiest: float
    """Its ``measure`` in the busiest minute the cut keeps."""

    def text(self) -> str:
        unit = "arrivals" if self.measure == "arrivals" else "tokens (prompt plus output)"
        return (f"{self.cut}: leaves out {self.requests:,} of the trace's {self.of:,} "
                f"requests, among them a busier minute by {self.measure} than any it keeps "
                f"({self.busiest_at_s:,.0f}-{self.busiest_at_s + MINUTE_S:,.0f} s of the "
                f"trace: {self.busiest:,.0f} {unit}, against {self.kept_busiest:,.0f} in "
                "the busiest minute kept); a verdict on the cut may not hold on the whole "
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


def busiest_minute(times: Sequence[float],
                   weights: Sequence[float] | np.ndarray | None = None) -> tuple[float, float]:
    """The start of the minute with the most of the sorted ``times`` in it, and how many
    (or, given each time's ``weights``, the most of their sum); (0.0, 0) for none. Each
    minute starts at an arrival (the busiest one always can), as ``windows.py``'s do."""
    if len(times) == 0:
        return 0.0, 0
    at = np.asarray(times, dtype=np.float64)
    w = np.ones(len(at)) if weights is None else np.asarray(weights, dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(w)))
    lo = np.arange(len(at))
    hi = np.searchsorted(at, at + MINUTE_S, side="left")
    sums = cum[hi] - cum[lo]
    best = int(np.argmax(sums))  # the first of equals: deterministic
    return float(at[best]), float(sums[best])


def left_out(spec: TraceSpec, cut: str) -> LeftOut | None:
    """What ``spec``'s cut leaves out, where its busiest minute outside the cut has more
    arrivals or more tokens than any minute inside; None for an uncut trace or a cut that
    keeps its busiest minutes by both."""
    if spec.start_s == 0.0 and spec.end_s is None and spec.max_requests is None:
        return None
    whole = read_cached(spec.trace, spec.fmt, spec.model).records
    kept = window(whole, start_s=spec.start_s, end_s=spec.end_s,
                  max_requests=spec.max_requests)
    kept_ids = {r.index for r in kept}  # each record's place in the whole trace
    # Counted on the whole trace (sorted by arrival, as fresh_tokens needs), so a kept
    # request's prefix sent before the cut is fresh neither inside nor outside it.
    tokens = fresh_tokens(whole)
    is_kept = np.array([r.index in kept_ids for r in whole], dtype=bool)
    if is_kept.all():
        return None
    times = np.array([r.arrival_time for r in whole], dtype=np.float64)
    worst: LeftOut | None = None
    measures: tuple[tuple[Literal["arrivals", "tokens"], np.ndarray | None], ...] = (
        ("arrivals", None), ("tokens", tokens))
    for measure, weights in measures:
        at, busiest = busiest_minute(times[~is_kept],
                                     None if weights is None else weights[~is_kept])
        _, inside = busiest_minute(times[is_kept],
                                   None if weights is None else weights[is_kept])
        if busiest <= inside:
            continue
        if worst is None or busiest * worst.kept_busiest > worst.busiest * inside:
            worst = LeftOut(cut, int((~is_kept).sum()), len(whole), measure, at,
                            busiest, inside)
    return worst
