"""Time the engine loop around the executor: what a token gap holds besides the pass.

A user's time between two tokens is the whole step (``LLMEngine.last_step_s``): the
scheduler's plan, the executor, the update of every request, the observers (metrics).
The real engine (scheduler, block manager, metrics observer, as a server runs it)
serves a few bursts of requests on the calibrated executor; each step's host time is
its step time minus the executor's ``elapsed_s``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from slopilot.engine.calibrate.fit import Observation
from slopilot.engine.calibrate.harness import TimedExecutor
from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.sim.shape import shape_of


@dataclass(frozen=True)
class HostStep:
    observation: Observation  # shape and host seconds (step minus executor)
    step_s: float
    executor_s: float


class _Recorder:
    """Engine observer: one ``HostStep`` per iteration."""

    def __init__(self) -> None:
        self.steps: list[HostStep] = []

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        shape = shape_of(out)
        host = engine.last_step_s - elapsed_s
        self.steps.append(HostStep(Observation(shape, host, f"step {engine.num_steps}",
                                               shape.kind), engine.last_step_s, elapsed_s))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None: ...
    def on_finished(self, req: Request, now: float) -> None: ...


def burst_sizes(max_num_seqs: int, quick: bool) -> list[int]:
    return [1, max(2, max_num_seqs // 2)] if quick else \
        [1, max(2, max_num_seqs // 4), max(2, max_num_seqs // 2), max_num_seqs]


def measure_host(executor: TimedExecutor, config: EngineConfig, *, max_context: int,
                 quick: bool = False, seed: int = 0, model_name: str = "calibration",
                 progress: Callable[[str], None] | None = None) -> list[HostStep]:
    """Serve bursts of requests on ``executor`` and return every step's times."""
    recorder = _Recorder()
    metrics = EngineMetrics(model_name)
    engine = LLMEngine(config, executor, executor.num_gpu_blocks, executor.num_cpu_blocks,
                       observers=[MetricsObserver(metrics), recorder])
    rng = random.Random(seed)
    longest = max(16, min(config.token_budget, max_context // 2))
    outputs = 8 if quick else 16
    n = 0
    for burst in burst_sizes(config.max_num_seqs, quick):
        for _ in range(burst):
            prompt = [3 + rng.randrange(50) for _ in range(rng.randint(16, longest))]
            engine.add_request(Request(f"host{n}", prompt, SamplingParams(
                max_tokens=outputs, ignore_eos=True)))
            n += 1
        while engine.has_work():
            engine.step()
            if progress is not None:
                progress(f"engine loop: burst of {burst}")
    return recorder.steps


def expected_steps(max_num_seqs: int, quick: bool) -> int:
    """Roughly how many steps ``measure_host`` runs (for a progress bar's total)."""
    outputs = 8 if quick else 16
    return sum(outputs + 1 + b // 4 for b in burst_sizes(max_num_seqs, quick))
