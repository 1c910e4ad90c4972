"""The same requests, with the same arrival times, through the real engine and the twin.

``replay_real`` drives the real engine loop (scheduler, block manager, executor, metrics
observer) on the wall clock: before each step it admits every request whose arrival
time has come, stamped with that time (a request that arrived mid-iteration waited for
it, as in a server), and sleeps while idle. ``replay_sim`` hands the same specs to the
discrete-event simulator. A ``Recorder`` on each side keeps every token time and every
iteration (its shape, step time and executor time), from which ``compare`` computes
what the fidelity benchmark reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.shape import IterationShape, shape_of
from slopilot.engine.sim.workload import RequestSpec
from slopilot.engine.window_summary import WindowSummary


@dataclass
class Iteration:
    end: float
    step_s: float
    executor_s: float
    shape: IterationShape
    preempted: int


@dataclass
class Recorder:
    """Engine observer: token times per request and every iteration."""

    ttft: dict[str, float] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)
    priority: dict[str, int] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    iterations: list[Iteration] = field(default_factory=list)
    rejected: int = 0

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        self.iterations.append(Iteration(
            now, engine.last_step_s, elapsed_s, shape_of(out),
            out.num_preempted_recompute + out.num_preempted_swap))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft[req.request_id] = ttft_s
        self.priority[req.request_id] = int(req.priority)

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.gaps.setdefault(req.request_id, []).append(gap_s)

    def on_finished(self, req: Request, now: float) -> None:
        self.finished[req.request_id] = now


def request_for(spec: RequestSpec, index: int, arrival: float) -> Request:
    return Request(f"r{index}", list(spec.prompt_token_ids),
                   SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True),
                   priority=spec.priority, arrival_time=arrival)


@dataclass(frozen=True)
class RealRun:
    t0: float  # the engine clock's time of arrival 0
    wall_s: float
    cpu_share: float  # process CPU time / wall time over the run
    truncated: bool  # the time limit cut it short


def replay_real(engine: LLMEngine, specs: Sequence[RequestSpec], recorder: Recorder, *,
                time_limit_s: float = 3600.0, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> RealRun:
    """Serve ``specs`` on ``engine`` (wall clock) at their arrival times; see the module."""
    order = sorted(range(len(specs)), key=lambda i: specs[i].arrival_time)
    t0 = clock() + 0.01
    cpu0, truncated = time.process_time(), False
    i = 0
    while i < len(order) or engine.has_work():
        now = clock()
        if now - t0 > time_limit_s:
            truncated = True
            break
        while i < len(order) and t0 + specs[order[i]].arrival_time <= now:
            k = order[i]
            try:
                # Those a full queue displaced for it are refused as it would have been.
                recorder.rejected += len(engine.add_request(
                    request_for(specs[k], k, t0 + specs[k].arrival_time)))
            except (QueueFullError, PromptTooLongError):
                recorder.rejected += 1
            i += 1
        if engine.has_work():
            engine.step()
        elif i < len(order):
            sleep(max(0.0, t0 + specs[order[i]].arrival_time - clock()))
    wall = clock() - t0
    share = (time.process_time() - cpu0) / wall if wall > 0 else 1.0
    return RealRun(t0, wall, share, truncated)


class SpecWorkload:
    """A fixed list of request specs as a simulator workload (open loop)."""

    def __init__(self, specs: Sequence[RequestSpec]) -> None:
        self.specs = sorted(specs, key=lambda s: s.arrival_time)

    def initial(self) -> Iterator[RequestSpec]:
        return iter(self.specs)

    def on_finish(self, spec: RequestSpec, all_token_ids: list[int],
                  now: float) -> list[RequestSpec]:
        return []

    def on_rejected(self, spec: RequestSpec, now: float) -> list[RequestSpec]:
        return []


def replay_sim(scenario: Scenario, config: EngineConfig, specs: Sequence[RequestSpec],
               recorder: Recorder) -> WindowSummary:
    """The twin's run of ``specs`` (until every request is done); returns its summary."""
    from slopilot.engine.sim.simulator import simulate

    # Arrivals stop at duration_s: far past the last one, so every request runs out.
    horizon = max(s.arrival_time for s in specs) + 1e6
    run = simulate(scenario, config.to_dict(), workload=SpecWorkload(specs),
                   duration_s=horizon, observers=[recorder])
    return run.summary
