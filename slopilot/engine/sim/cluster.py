"""A deployment in virtual time that can be reconfigured and scaled while traffic runs.

``simulate()`` runs one fixed config over a whole workload; the closed-loop benchmark
needs the opposite: one continuous run whose knobs and replica count change whenever
the controller says so, and figures for any window of it. Each replica is the real
engine on its own virtual clock (as in ``simulator.py``); ``advance(t)`` processes
arrivals and iterations up to ``t``; each arrival goes where the scenario's dispatch
policy says (``dispatch.py``). Replica 0 is the canary. A replica scaled away drains: it
takes no new requests, under any policy, and leaves once empty.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Priority, Request, SamplingParams
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.sim.dispatch import Dispatcher
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.shape import KINDS, IterationShape, shape_of
from slopilot.engine.sim.simulator import build_engine
from slopilot.engine.sim.stats import percentile_ms, ttft_percentile_ms
from slopilot.engine.sim.workload import RequestSpec
from slopilot.engine.slo import SLOJudge, SLOSpec
from slopilot.engine.window_summary import ClassFigures, Window, WindowSummary


@dataclass
class _Events:
    """Per-event records of one replica: (time, class, value) rows, kept whole."""

    ttft: list[tuple[float, int, float]] = field(default_factory=list)
    gaps: list[tuple[float, int, float]] = field(default_factory=list)
    finished: list[tuple[float, int, bool, int, float]] = field(default_factory=list)
    """(finish time, class, met its SLO, output tokens, arrival time)."""
    steps: list[tuple[float, float, int]] = field(default_factory=list)
    iterations: list[tuple[float, float, IterationShape]] = field(default_factory=list)
    """(end time, step time, shape): what the engine's slopilot_iteration_* series sum."""
    refused: list[tuple[float, int, float]] = field(default_factory=list)
    """(time refused, class, arrival time) of the requests turned away for load: at the
    door by a full queue, or displaced from it later by a more urgent request."""
    arrived: list[float] = field(default_factory=list)
    """Arrival times of the requests dispatched to this replica (admitted or not)."""


class _Recorder:
    """Engine observer: what ``SimStats`` counts, but timestamped for any window."""

    def __init__(self, slo: SLOSpec) -> None:
        self.ev = _Events()
        self._judge = SLOJudge(slo)

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        preempted = out.num_preempted_recompute + out.num_preempted_swap
        self.ev.steps.append((now, elapsed_s, preempted))
        self.ev.iterations.append((now, engine.last_step_s, shape_of(out)))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ev.ttft.append((now, int(req.priority), ttft_s))

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self._judge.on_token_gap(req, gap_s)
        self.ev.gaps.append((now, int(req.priority), gap_s))

    def on_finished(self, req: Request, now: float) -> None:
        met = self._judge.finished(req)
        if met is None:
            return
        self.ev.finished.append((now, int(req.priority), met, req.num_output_tokens,
                                 req.arrival_time))


class _Replica:
    def __init__(self, index: int, engine: LLMEngine, clock: VirtualClock,
                 recorder: _Recorder) -> None:
        self.index, self.engine, self.clock, self.recorder = index, engine, clock, recorder
        self.draining = False


class SimCluster:
    """N simulated replicas on one workload; see the module docstring."""

    def __init__(self, scenario: Scenario, config: Mapping[str, Any], replicas: int, *,
                 seed: int | None = None, duration_s: float | None = None) -> None:
        if replicas < 1:
            raise ValueError(f"replicas={replicas}: need at least one replica")
        self.scenario = scenario
        self.config = scenario.engine_config().with_overrides(config)
        self.canary_config: EngineConfig | None = None
        self._index = itertools.count()
        self.reps: list[_Replica] = []
        self.retired: list[_Replica] = []
        self.arrivals: list[RequestSpec] = []
        self.now = 0.0
        self._counter = itertools.count()
        self._dispatcher = Dispatcher(scenario.dispatch,
                                      scenario.seed if seed is None else seed)
        self._source: Iterator[RequestSpec] = scenario.build_workload(
            seed=seed, duration_s=duration_s).initial()
        self._next: RequestSpec | None = next(self._source, None)
        for _ in range(replicas):
            self._add_replica()

    # ------------------------------------------------------------------ control
    @property
    def active(self) -> list[_Replica]:
        return [r for r in self.reps if not r.draining]

    def _add_replica(self) -> None:
        rec = _Recorder(self.scenario.slo)
        config = self.config
        if not self.active and self.canary_config is not None:
            config = self.canary_config
        engine, clock = build_engine(self.scenario, config, [rec])
        clock.t = self.now
        self.reps.append(_Replica(next(self._index), engine, clock, rec))

    def scale(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"replicas={n}: need at least one replica")
        while len(self.active) < n:
            self._add_replica()
        for rep in self.active[n:]:
            rep.draining = True  # the newest go first; the canary (first) stays

    def set_config(self, config: Mapping[str, Any], *, canary: bool) -> None:
        new = self.scenario.engine_config().with_overrides(config)
        active = self.active
        if canary and len(active) > 1:
            self.canary_config = new
            active[0].engine.scheduler.update_config(new)
            return
        self.config, self.canary_config = new, None
        for rep in self.reps:
            rep.engine.scheduler.update_config(new)

    # ------------------------------------------------------------------ time
    def advance(self, t: float) -> None:
        """Run every arrival and iteration that starts before ``t``."""
        while True:
            t_arrival = self._next.arrival_time if self._next is not None else math.inf
            busy = [r for r in self.reps if r.engine.has_work()]
            rep = min(busy, key=lambda r: r.clock.t) if busy else None
            if rep is not None and rep.clock.t <= t_arrival and rep.clock.t < t:
                rep.engine.step()
                continue
            if t_arrival >= t:
                break
            spec = self._next
            self._next = next(self._source, None)
            if spec is not None:
                self._dispatch(spec)
        for rep in [r for r in self.reps if r.draining and not r.engine.has_work()]:
            self.reps.remove(rep)
            self.retired.append(rep)
        self.now = t

    def _dispatch(self, spec: RequestSpec) -> None:
        self.arrivals.append(spec)
        active = self.active  # a draining replica is never offered a new request
        rep = active[self._dispatcher.pick([len(r.engine.scheduler.requests) for r in active])]
        rep.recorder.ev.arrived.append(spec.arrival_time)
        if rep.clock.t < spec.arrival_time:
            rep.clock.t = spec.arrival_time
        if not rep.engine.scheduler.can_ever_finish(spec.num_prompt_tokens, spec.max_tokens):
            return  # as the engine would, unread (``simulator._admit``)
        req = Request(f"c{next(self._counter)}", list(spec.prompt_token_ids),
                      SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
                      priority=spec.priority, arrival_time=spec.arrival_time)
        try:
            displaced = rep.engine.add_request(req)
        except QueueFullError:  # its client was never served: a first token never given
            rep.recorder.ev.refused.append((spec.arrival_time, spec.priority,
                                            spec.arrival_time))
            return
        except PromptTooLongError:
            return  # counted by its absence from finished requests
        for gone in displaced:  # as the server counts it: refused now, in its own class
            rep.recorder.ev.refused.append((spec.arrival_time, gone.priority,
                                            gone.arrival_time))

    # ------------------------------------------------------------------ figures
    def attainment_by_arrival(self, start: float, end: float, priority: Priority
                              ) -> float | None:
        """Share of the class's requests *arriving* in ``[start, end)`` that met the SLO.

        ``summary`` counts requests by when they finish, so a window right after a bad
        config carries that config's backlog; this one charges each request to the
        config it arrived under. Requests still running at ``now`` are left out; those
        turned away for load count as missed.
        """
        reps = self.reps + self.retired
        done = [ok for rep in reps for _, c, ok, _, arrived in rep.recorder.ev.finished
                if c == int(priority) and start <= arrived < end]
        done += [False for rep in reps for _, c, arrived in rep.recorder.ev.refused
                 if c == int(priority) and start <= arrived < end]
        return sum(done) / len(done) if done else None

    def iteration_samples(self, start: float, end: float, *, canary: bool = False
                          ) -> list[WindowSample]:
        """Per kind, the iterations that ended in ``[start, end)``, summed over the
        replicas (or the canary's alone): the increases a scrape of their
        ``slopilot_iteration_*`` series would show over that window."""
        reps = [self.reps[0]] if canary and self.reps else self.reps + self.retired
        sums: dict[str, tuple[int, float, IterationShape]] = {}
        for rep in reps:
            for t, step_s, shape in rep.recorder.ev.iterations:
                if start <= t < end:
                    n, s, total = sums.get(shape.kind, (0, 0.0, IterationShape()))
                    sums[shape.kind] = (n + 1, s + step_s, total + shape)
        return [WindowSample(k, float(sums[k][0]), sums[k][1], sums[k][2])
                for k in KINDS if k in sums]

    def _measured(self, canary: bool) -> list[_Replica]:
        """The replicas a window reads: the canary alone, or every one (retired too)."""
        return [self.reps[0]] if canary and self.reps else self.reps + self.retired

    def waiting(self, *, canary: bool = False) -> int:
        """Requests waiting for their first step now, as vLLM's ``num_requests_waiting``
        summed over the replicas measured."""
        return sum(rep.engine.scheduler.num_waiting for rep in self._measured(canary))

    def arrival_rate(self, start: float, end: float, *, canary: bool = False) -> float:
        """Requests that arrived on the replicas measured a second in ``[start, end)``."""
        if end <= start:
            raise ValueError(f"window [{start}, {end}) is empty")
        return sum(bisect_left(arrived, end) - bisect_left(arrived, start)
                   for arrived in (rep.recorder.ev.arrived for rep in self._measured(canary))
                   ) / (end - start)

    def summary(self, start: float, end: float, *, canary: bool = False) -> WindowSummary:
        """The figures of ``[start, end)``: every replica, or the canary alone."""
        if end <= start:
            raise ValueError(f"window [{start}, {end}) is empty")
        reps = self._measured(canary)
        dur = end - start
        ev = _Events()
        for rep in reps:
            for name in ("ttft", "gaps", "finished", "steps", "refused"):
                getattr(ev, name).extend(_within(getattr(rep.recorder.ev, name), start, end))
        classes = {p: _figures([v for _, c, v in ev.ttft if c == p],
                               [v for _, c, v in ev.gaps if c == p],
                               [(ok, n) for _, c, ok, n, _ in ev.finished if c == p],
                               sum(1 for _, c, _ in ev.refused if c == p), dur)
                   for p in Priority}
        overall = _figures([v for _, _, v in ev.ttft], [v for _, _, v in ev.gaps],
                           [(ok, n) for _, _, ok, n, _ in ev.finished], len(ev.refused), dur)
        preempted = sum(n for _, _, n in ev.steps)
        return WindowSummary(
            duration_s=dur, preemptions_per_min=preempted / dur * 60.0, overall=overall,
            classes=classes, replicas=len(reps),
            busy_ratio=sum(e for _, e, _ in ev.steps) / dur / max(1, len(reps)),
            # The canary's own arrivals in a canary window, as its selected series read.
            request_rate=self.arrival_rate(start, end, canary=canary),
            window=Window(start, end, canary))


def _within(rows: list[Any], start: float, end: float) -> list[Any]:
    """The rows of ``[start, end)`` by their first field, their time. A replica's rows
    are in time order as written: its clock only moves forward, and arrivals (the time of
    a refusal) come in order. Found by bisection: a window read each tick scanned every
    row of the run so far (tests/tuner/test_bursty_scale_down.py: 46 -> 42 s of CPU)."""
    lo = bisect_left(rows, start, key=_at)
    return rows[lo:bisect_left(rows, end, lo, key=_at)]


def _at(row: tuple[Any, ...]) -> Any:
    return row[0]


def _figures(ttft: list[float], gaps: list[float], done: list[tuple[bool, int]],
             refused: int, dur: float) -> ClassFigures:
    return ClassFigures(
        requests_finished=len(done),
        throughput_tok_s=(len(ttft) + len(gaps)) / dur,
        goodput_tok_s=sum(n for ok, n in done if ok) / dur,
        ttft_p99_ms=ttft_percentile_ms(ttft, refused, 99), tbt_p99_ms=percentile_ms(gaps, 99),
        slo_attainment=(sum(1 for ok, _ in done if ok) / (len(done) + refused)
                        if done or refused else None), requests_refused=refused,
        ttft_samples=len(ttft) + refused)
