"""How a replay paced a trace's sessions: the follow-up turns that arrived before the
previous turn's answer had ended in the run.

A replay sends each turn at the trace's time, and ``--time-scale``/``--target-rate``
scale every gap, the think time between a session's turns too (the same factor as the
arrival rate: a replay at 4x the rate is one of users thinking 4x faster). A chat
client sends its next turn only once the answer has come, so a turn sent before it is
traffic no user makes: at 4 req/s the reviewer's chat trace had 80 of 775 follow-ups so.
The replay keeps the trace's times (its rate is what was asked for) and counts them in
the run, where an answer's end is known, for ``simulate`` and ``tune`` to say in the
same words (``pace_warning``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slopilot.engine.sim.trace_formats import TraceRecord

if TYPE_CHECKING:
    from slopilot.engine.sim.trace_scenario import TraceOptions
    from slopilot.engine.sim.workload_spec import TraceSpec


@dataclass(slots=True)
class SessionPace:
    """Of the follow-up turns whose previous turn was answered in the run
    (``follow_ups``), those that arrived before that answer had ended (``early``)."""

    follow_ups: int = 0
    early: int = 0

    def answered(self, next_arrival: float, now: float) -> None:
        """A turn answered at ``now``, its session's next turn arriving at
        ``next_arrival``."""
        self.follow_ups += 1
        self.early += next_arrival < now

    def add(self, other: SessionPace) -> None:
        """``other``'s counts too (a tuner's windows, each a replay of its own)."""
        self.follow_ups += other.follow_ups
        self.early += other.early

    def text(self, scaling: str | None, factor: float | None,
             run: str = "this run") -> str | None:
        """What to tell the user: ``scaling`` names the flag or field that scaled the
        trace's times by ``factor`` (None where none did), ``run`` the replay counted;
        None where nothing is worth saying (no follow-ups answered, or none early in an
        unscaled replay)."""
        if self.follow_ups == 0:
            return None
        counted = (f"{self.early:,} of {self.follow_ups:,} follow-up turns of a session "
                   f"arrived before the previous turn's answer had ended in {run}, as "
                   "no chat client sends one")
        if scaling is not None and factor is not None and factor != 1:
            return (f"{scaling} scales every gap by {factor:.3g}, the think time between "
                    f"a session's turns too: {counted}" + (
                        "; a rate nearer the trace's keeps more of it" if self.early
                        else ""))
        if not self.early:
            return None
        return (f"{counted}: the trace's gaps are replayed as recorded, and this "
                "deployment answered slower than the traced one")


def pace_warning(spec: TraceSpec, given: TraceOptions, pace: SessionPace,
                 run: str = "this run") -> str | None:
    """``pace.text`` with what scaled the trace's gaps named as the user gave it: the
    flag (``given``, the trace flags) or the scenario's field, and its factor."""
    scaling = None
    if spec.target_rate is not None:
        by_flag = given.target_rate == spec.target_rate
        scaling = (f"--target-rate {spec.target_rate:g}" if by_flag
                   else f"the scenario's target_rate {spec.target_rate:g}")
    elif spec.time_scale is not None:
        by_flag = given.time_scale == spec.time_scale
        scaling = (f"--time-scale {spec.time_scale:g}" if by_flag
                   else f"the scenario's time_scale {spec.time_scale:g}")
    return pace.text(scaling, spec.scale(), run)


@dataclass(frozen=True, slots=True)
class SessionTurns:
    """Each record's turn in its session (0 for a request in none), and when its
    session's next turn arrives (inf for a session's last turn or a request in none):
    12 bytes a row, held for a replay."""

    turn: np.ndarray
    next_arrival: np.ndarray

    @classmethod
    def of(cls, records: list[TraceRecord]) -> SessionTurns | None:
        """None for records in no session (nothing held, nothing to count)."""
        if all(r.session_id is None for r in records):
            return None
        n = len(records)
        sessions = np.fromiter((-1 if r.session_id is None else r.session_id
                                for r in records), dtype=np.int64, count=n)
        times = np.fromiter((r.arrival_time for r in records), dtype=np.float64, count=n)
        order = np.argsort(sessions, kind="stable")  # each session's rows, in arrival order
        ordered = sessions[order]
        starts = np.ones(n, dtype=bool)
        starts[1:] = ordered[1:] != ordered[:-1]
        first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
        turn = np.zeros(n, dtype=np.int32)
        turn[order] = np.arange(n) - first
        next_arrival = np.full(n, np.inf)
        follows = ~starts[1:]  # order[k + 1] is the turn after order[k]
        next_arrival[order[:-1][follows]] = times[order[1:][follows]]
        alone = sessions == -1
        turn[alone] = 0
        next_arrival[alone] = np.inf
        return cls(turn, next_arrival)
