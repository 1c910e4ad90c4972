"""``SlidingStats``: one replay's figures over each sliding window of it, beside its own.

A whole-trace replay judged as one P99 lets a long quiet tail dilute the burst that the
live alerts, which judge a sliding window, would fire on. Replaying each window apart
costs one run per window; a ``SimStats`` per window, fed by the one run, gives the same
figures (each window's requests followed to their end on the engine the whole trace drove
them to) for the cost of counting each token once per window that holds its request.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slopilot.engine.request import Priority, Request
from slopilot.engine.sim.stats import SimStats
from slopilot.engine.window_summary import RunInfo, WindowSummary

if TYPE_CHECKING:
    from slopilot.engine.engine import LLMEngine
    from slopilot.engine.outputs import SchedulerOutput
    from slopilot.engine.slo import SLOSpec


@dataclass(frozen=True, slots=True)
class Sliding:
    """Windows of ``length_s`` every ``hop_s`` over a run's measured span, and one from
    each of ``at`` (the starts a sweep of the run found worst: ``window_sweep.py``);
    ``hop_s`` None: those alone."""

    length_s: float
    hop_s: float | None
    at: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name, v in (("length_s", self.length_s), ("hop_s", self.hop_s)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"Sliding.{name}={v!r}: expected seconds > 0")
        if self.hop_s is None and not self.at:
            raise ValueError("Sliding(hop_s=None, at=()): no window; give hop_s (seconds "
                             "between starts) or at (the starts)")

    def starts(self, start_s: float, end_s: float) -> list[float]:
        """The windows' starts over ``[start_s, end_s)``: every ``hop_s`` while a whole
        window fits, and one more ending at ``end_s`` so that the last arrivals are in a
        window of full length; one window (the span) where it is shorter than one; and
        each of ``at`` within the span (a window from it ends early at ``end_s``)."""
        out = [] if self.hop_s is None else self._grid(start_s, end_s, self.hop_s)
        out += [s for s in self.at if start_s <= s < end_s]
        return sorted(set(out))

    def _grid(self, start_s: float, end_s: float, hop_s: float) -> list[float]:
        last = end_s - self.length_s
        if last <= start_s:
            return [start_s]
        n = math.floor((last - start_s) / hop_s + 1e-9)
        out = [start_s + k * hop_s for k in range(n + 1)]
        if last - out[-1] > 1e-9:
            out.append(last)
        return out


@dataclass(frozen=True, slots=True)
class FirstToken:
    """One request's arrival, class and time to first token."""

    arrival_s: float
    priority: Priority
    ttft_s: float


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One sliding window's figures."""

    start_s: float
    end_s: float
    summary: WindowSummary


class SlidingStats(SimStats):
    """``SimStats`` over the whole measured span, and a ``SimStats`` per sliding window."""

    def __init__(self, slo: SLOSpec, end_time: float, sliding: Sliding, *,
                 start_time: float = 0.0, horizon: float | None = None) -> None:
        super().__init__(slo, end_time, start_time=start_time, horizon=horizon)
        self.sliding = sliding
        starts = sliding.starts(start_time, end_time)
        self.parts = [SimStats(slo, min(s + sliding.length_s, end_time), start_time=s,
                               horizon=self.horizon) for s in starts]
        self._starts = starts
        self._of: dict[str, list[SimStats]] = {}
        self.first_tokens: list[FirstToken] = []
        """Every measured request's first token, for a sweep over every window start
        (``window_sweep.py``): one record a request, not a window's count a start."""

    def _near(self, t: float) -> list[SimStats]:
        # Called per step and per arrival: only the windows that can hold t, by their
        # sorted starts (hundreds over an hour's trace).
        lo = bisect_left(self._starts, t - self.sliding.length_s - 1e-9)
        return self.parts[lo:bisect_right(self._starts, t)]

    def _holding(self, t: float) -> list[SimStats]:
        return [p for p in self._near(t) if p.start_time <= t < p.end_time]

    def on_arrival(self, req: Request) -> None:
        super().on_arrival(req)
        parts = self._holding(req.arrival_time)
        if parts:
            self._of[req.request_id] = parts
        for p in parts:
            p.on_arrival(req)

    def on_rejected(self, arrival_time: float, priority: Priority, max_tokens: int, *,
                    for_load: bool = False) -> None:
        super().on_rejected(arrival_time, priority, max_tokens, for_load=for_load)
        for p in self._holding(arrival_time):
            p.on_rejected(arrival_time, priority, max_tokens, for_load=for_load)

    def on_displaced(self, req: Request) -> None:
        super().on_displaced(req)
        for p in self._of.get(req.request_id, ()):
            p.on_displaced(req)

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        super().on_step(engine, out, elapsed_s, now)
        for p in self._near(now):
            p.on_step(engine, out, elapsed_s, now)

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        super().on_first_token(req, ttft_s, now)
        if self.start_time <= req.arrival_time < self.end_time:
            self.first_tokens.append(FirstToken(req.arrival_time, req.priority, ttft_s))
        for p in self._of.get(req.request_id, ()):
            p.on_first_token(req, ttft_s, now)

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        super().on_token_gap(req, gap_s, now)
        for p in self._of.get(req.request_id, ()):
            p.on_token_gap(req, gap_s, now)

    def on_finished(self, req: Request, now: float) -> None:
        super().on_finished(req, now)
        for p in self._of.pop(req.request_id, ()):
            p.on_finished(req, now)

    def close(self) -> None:
        super().close()
        for p in self.parts:
            p.close()

    def windows(self, run: RunInfo | None = None, replicas: int | None = None
                ) -> list[WindowFigures]:
        return [WindowFigures(p.start_time, p.end_time,
                              p.summary(p.end_time - p.start_time, run, replicas=replicas))
                for p in self.parts]
