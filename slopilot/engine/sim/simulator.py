"""Discrete-event simulation of one deployment: N engine replicas on a GPU cost model.

Each replica is the real engine (scheduler, block manager, engine loop) on a
``SimulatedExecutor`` and its own virtual clock. Events are processed in time order:
the replica whose clock is earliest runs its next iteration unless an arrival comes
first; an arrival joins the replica the scenario's dispatch policy picks (``dispatch.py``:
at random by default, as the Service in front of the replicas does).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, StepObserver, VirtualClock
from slopilot.engine.executors.simulated import SimulatedExecutor
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from slopilot.engine.sim.cost_model import CostModelError
from slopilot.engine.sim.dispatch import Dispatcher
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.stats import SimStats
from slopilot.engine.sim.twin import cost_model_for, twin_label
from slopilot.engine.sim.window_stats import Sliding, SlidingStats, WindowFigures
from slopilot.engine.sim.workload import RequestSpec, Workload
from slopilot.engine.window_summary import RunInfo, WindowSummary


@dataclass(frozen=True, slots=True)
class Measure:
    """Which part of a run its figures count, on the run's clock.

    Requests arriving in ``[start_s, end_s)`` are counted, and followed until
    ``horizon_s``, where the run stops; what they still wait for then is censored (see
    ``RequestAccounting``). Arrivals before ``start_s`` are warm-up: they fill the engine
    so that the window does not start on an idle one, as no window of live traffic does.
    Arrivals after ``end_s`` keep loading it until the horizon, as they would live.
    """

    start_s: float
    end_s: float
    horizon_s: float

    def __post_init__(self) -> None:
        values = (self.start_s, self.end_s, self.horizon_s)
        if not all(math.isfinite(v) for v in values) or not (
                0.0 <= self.start_s < self.end_s <= self.horizon_s):
            raise ValueError(f"Measure{values}: need 0 <= start_s < end_s <= horizon_s "
                             "(start_s <= end_s <= horizon_s, a window of positive length)")

    @classmethod
    def whole(cls, duration_s: float) -> Measure:
        """Every request arriving in ``[0, duration_s)``, the run ending there."""
        return cls(0.0, duration_s, duration_s)


class StalledClockError(CostModelError):
    """A replica ran iteration after iteration that its cost model priced as no time."""


STALLED_STEP_S = 1e-6
"""A step that moves its replica's clock less than this took no time: a tenth of the
floor a profile's cheapest step must reach (``profile_types.MIN_STEP_S``)."""
MAX_STALLED_STEPS = 10_000
"""Such steps in a row before the run is stopped. A closed loop with no think time
follows each answer at the instant it ends, so on steps that cost nothing its clock never
moved and the run never ended (its requests piling up in memory); one at 1e-12 s a step
moved it, by a year's worth of iterations an hour. No real twin runs even a few in a
row: only a step that schedules nothing costs nothing."""

ProgressFn = Callable[[float], None]
"""Called with the virtual time reached, every few hundred iterations."""
_PROGRESS_EVERY = 500


@dataclass
class SimRun:
    """A finished run: the summary plus the objects a caller may want to inspect."""

    summary: WindowSummary
    engines: list[LLMEngine]
    stats: SimStats
    # Each replica's Prometheus exposition at the end (when asked for).
    metrics: list[bytes] = field(default_factory=list)
    windows: list[WindowFigures] = field(default_factory=list)
    """Each sliding window's figures, where ``simulate`` was asked for them."""


class _Replica:
    def __init__(self, engine: LLMEngine, clock: VirtualClock,
                 metrics: EngineMetrics | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        """Its exporter (``with_metrics``): told the requests turned away, as a server's."""
        self.specs: dict[str, RequestSpec] = {}
        self.rejected = 0
        self.stalled = 0
        """Iterations in a row that moved its clock by less than ``STALLED_STEP_S``."""


def build_engine(scenario: Scenario, config: EngineConfig,
                 observers: list[StepObserver] | None = None,
                 realtime: bool = False) -> tuple[LLMEngine, VirtualClock]:
    """One replica of the scenario's deployment on a virtual clock."""
    cost = cost_model_for(scenario)
    executor = SimulatedExecutor(cost, block_size=config.block_size, realtime=realtime)
    util = scenario.gpu_memory_utilization or 0.9
    clock = VirtualClock()
    engine = LLMEngine(config, executor, executor.num_gpu_blocks(util),
                       executor.num_cpu_blocks(config.swap_space_gb),
                       executor.swap_time_per_block_s, clock=clock,
                       observers=observers)
    return engine, clock


def simulate(scenario: Scenario, overrides: Mapping[str, Any] | None = None, *,
             replicas: int | None = None, duration_s: float | None = None,
             seed: int | None = None, workload: Workload | None = None,
             observers: list[StepObserver] | None = None,
             check_integrity: bool = False, with_metrics: bool = False,
             measure: Measure | None = None, progress: ProgressFn | None = None,
             until_judged: bool = False, sliding: Sliding | None = None) -> SimRun:
    """Run ``scenario`` with knob ``overrides`` in virtual time; returns its summary.

    By default arrivals stop at ``duration_s`` and the figures count the requests that
    arrived before it, up to that time. ``measure`` counts a window instead (warm-up
    before it, a horizon after it; ``duration_s`` is then ignored). ``with_metrics``
    feeds each replica's engine loop into ``EngineMetrics`` as a live server does (it
    costs a little speed), and returns the final exposition. ``progress`` is told the
    virtual time every few hundred iterations (a progress bar's feed). ``until_judged``
    ends the run before the horizon once the window is past and every request it counts
    has finished: nothing simulated after that can change the window's figures, and a
    drain sized for requests that live minutes then costs only what they take. The
    run-wide ones (``RunInfo``: rejections and prefix-cache hits over the whole run,
    warm-up included) cover the run as far as it went, and the engines are left as they
    were then: leave it off to inspect them or their metrics at the horizon. ``sliding``
    also measures each sliding window of the measured span (``SimRun.windows``, from the
    same run: ``window_stats.py``).
    """
    config = scenario.engine_config().with_overrides(overrides or {})
    if measure is None:
        measure = Measure.whole(scenario.duration_s if duration_s is None else duration_s)
    duration = measure.horizon_s
    num_replicas = scenario.replicas if replicas is None else replicas
    if num_replicas < 1:
        raise ValueError(f"replicas={num_replicas}: need at least one replica")
    stats = SimStats(scenario.slo, end_time=measure.end_s, start_time=measure.start_s,
                     horizon=measure.horizon_s) if sliding is None else SlidingStats(
        scenario.slo, measure.end_s, sliding, start_time=measure.start_s,
        horizon=measure.horizon_s)
    reps = []
    exporters: list[EngineMetrics] = []
    for i in range(num_replicas):
        engine, clock = build_engine(scenario, config, [stats, *(observers or [])])
        if with_metrics:
            metrics = EngineMetrics(scenario.model, clock=clock.now,
                                    info={"replica": str(i), "scenario": scenario.name})
            metrics.set_slo(scenario.slo)  # its verdicts are the summary's goodput
            engine.observers.append(MetricsObserver(metrics))
            exporters.append(metrics)
        reps.append(_Replica(engine, clock, exporters[-1] if with_metrics else None))
    wl = workload or scenario.build_workload(seed=seed, duration_s=duration)
    dispatcher = Dispatcher(scenario.dispatch, scenario.seed if seed is None else seed)
    _run(reps, wl, duration, stats, dispatcher, check_integrity, progress,
         judged_after=measure.end_s if until_judged else None, label=twin_label(scenario))
    stats.close()

    queries = sum(r.engine.scheduler.prefix_queries for r in reps)
    hits = sum(r.engine.scheduler.prefix_hits for r in reps)
    run = RunInfo(scenario=scenario.name, config=config.to_dict(),
                  rejected=sum(r.rejected for r in reps),
                  prefix_hit_rate=hits / queries if queries else 0.0,
                  twin=twin_label(scenario), calibrated=scenario.profile is not None)
    summary = stats.summary(measure.end_s - measure.start_s, run, replicas=num_replicas)
    windows = stats.windows(run, num_replicas) if isinstance(stats, SlidingStats) else []
    return SimRun(summary, [r.engine for r in reps], stats, [m.render() for m in exporters],
                  windows)


def _run(reps: list[_Replica], workload: Workload, duration: float, stats: SimStats,
         dispatcher: Dispatcher, check_integrity: bool, progress: ProgressFn | None,
         judged_after: float | None = None, label: str = "cost model") -> None:
    counter = itertools.count()
    # (arrival, tie-break, spec, came from the up-front source)
    pending: list[tuple[float, int, RequestSpec, bool]] = []
    source: Iterator[RequestSpec] = workload.initial()

    def pull() -> None:
        # Keep one lookahead arrival from the (possibly lazy) source in the heap.
        spec = next(source, None)
        if spec is not None:
            heapq.heappush(pending, (spec.arrival_time, next(counter), spec, True))

    pull()
    steps = 0
    while True:
        t_arrival = pending[0][0] if pending else math.inf
        busy = [r for r in reps if r.engine.has_work()]
        if judged_after is not None and t_arrival >= judged_after and stats.all_judged() \
                and all(r.clock.t >= judged_after for r in busy):
            # No counted request is left to arrive or to finish, and every iteration
            # that ends in the window has run (a later one could still follow up a
            # session into it, or count towards busy and KV usage): the figures are final.
            break
        rep = min(busy, key=lambda r: r.clock.t) if busy else None
        if rep is not None and rep.clock.t <= t_arrival:
            if rep.clock.t >= duration:
                break
            before = rep.clock.t
            update = rep.engine.step()
            steps += 1
            _count_stall(reps, rep, before, label)
            if progress is not None and steps % _PROGRESS_EVERY == 0:
                progress(min(rep.clock.t, duration))
            for req in update.finished:
                spec = rep.specs.pop(req.request_id)
                for follow in workload.on_finish(spec, req.all_token_ids(), rep.clock.t):
                    heapq.heappush(
                        pending, (follow.arrival_time, next(counter), follow, False))
            if check_integrity:
                rep.engine.scheduler.check_integrity()
            continue
        if t_arrival >= duration:
            break
        _, _, spec, from_source = heapq.heappop(pending)
        if from_source:
            pull()
        rep = reps[dispatcher.pick([len(r.engine.scheduler.requests) for r in reps])]
        for refused in _admit(rep, spec, next(counter), stats):
            # Refused now: the newcomer at the door, or one it displaced from a full queue.
            for follow in workload.on_rejected(refused, spec.arrival_time):
                heapq.heappush(pending, (follow.arrival_time, next(counter), follow, False))
    if progress is not None:
        # Where the run stopped: the horizon, or sooner when nothing was left to do (or
        # to judge).
        progress(min(duration, max(r.clock.t for r in reps)))
    # Anything still in flight at the end is cut off; SimStats.close censors it.


def _count_stall(reps: list[_Replica], rep: _Replica, before: float, label: str) -> None:
    """Stop a run whose replica's clock stands still (``MAX_STALLED_STEPS``)."""
    if rep.clock.t - before >= STALLED_STEP_S:
        rep.stalled = 0
        return
    rep.stalled += 1
    if rep.stalled >= MAX_STALLED_STEPS:
        raise StalledClockError(
            f"replica {reps.index(rep)}: its virtual clock stood at {rep.clock.t:.6g} s "
            f"through {rep.stalled:,} iterations in a row, each under "
            f"{STALLED_STEP_S * 1e6:g} us by the {label}: no engine step is that fast, and "
            "the run would never end; check the cost model (a profile's coefficients: "
            "`slopilot calibrate` writes measured ones)")


def _admit(rep: _Replica, spec: RequestSpec, n: int, stats: SimStats) -> list[RequestSpec]:
    """Admit ``spec`` to the replica dispatched to, as its server would; the specs refused
    for it: ``spec`` itself, or those a full queue displaced to make room for it
    (``queue_room.py``), each a refusal of its own class, as the server counts one."""
    if rep.clock.t < spec.arrival_time:
        rep.clock.t = spec.arrival_time
    rid = f"s{n}"
    # Judged by length before the prompt is read: a trace's prompt is drawn only then,
    # and one no replica holds (a typo, a hostile file) would cost its size in memory.
    # With its output too: the server refuses a request past the model's context or one
    # the cache cannot see finish (``context_limit``).
    if not rep.engine.scheduler.can_ever_finish(spec.num_prompt_tokens, spec.max_tokens):
        rep.rejected += 1
        stats.on_rejected(spec.arrival_time, spec.priority, spec.max_tokens)
        return [spec]
    req = Request(rid, list(spec.prompt_token_ids),
                  SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
                  priority=spec.priority, arrival_time=spec.arrival_time)
    try:
        displaced = rep.engine.add_request(req)
    except (QueueFullError, PromptTooLongError) as exc:
        rep.rejected += 1
        for_load = isinstance(exc, QueueFullError)
        stats.on_rejected(spec.arrival_time, spec.priority, spec.max_tokens,
                          for_load=for_load)
        if for_load and rep.metrics is not None:
            rep.metrics.count_refused(spec.priority, rep.metrics.slo)
        return [spec]
    stats.on_arrival(req)
    rep.specs[rid] = spec
    for gone in displaced:
        rep.rejected += 1
        stats.on_displaced(gone)
        if rep.metrics is not None:
            rep.metrics.count_refused(gone.priority, rep.metrics.slo)
    return [rep.specs.pop(gone.request_id) for gone in displaced]
