"""Time the engine loop around the executor: what a token gap holds besides the pass.

A user's time between two tokens is the whole step (``LLMEngine.last_step_s``): the
scheduler's plan, the executor, the update of every request, the observers (metrics).
The real engine (scheduler, block manager, metrics observer, as a server runs it)
serves a few bursts of requests on the calibrated executor, and single requests after
short idle gaps (the first iteration after idling runs on cold caches); the runner fits
the loop's coefficients to each step's time minus the executor model's prediction.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slopilot.engine.calibrate.fit import Observation
from slopilot.engine.calibrate.harness import TimedExecutor
from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import Clock, LLMEngine
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.sim.shape import IterationShape, output_rows, shape_of, shape_of_rows

Rows = tuple[tuple[int, int, bool], ...]


@dataclass(frozen=True)
class HostStep:
    shape: IterationShape
    step_s: float
    executor_s: float
    label: str
    # What the shape was computed from, so a refit can recompute it on another form.
    rows: Rows = ()
    swaps: tuple[int, int] = (0, 0)  # blocks swapped out, in
    after_idle: bool = False
    knee: int | None = field(default=None, compare=False)
    graph_batch: int | None = field(default=None, compare=False)

    def reshaped(self, knee: int | None, graph_batch: int | None = None) -> HostStep:
        """The same step with its shape recomputed by today's form, ``knee`` and
        ``graph_batch``."""
        shape = shape_of_rows(self.rows, *self.swaps, after_idle=self.after_idle, knee=knee,
                              graph_batch=graph_batch)
        return HostStep(shape, self.step_s, self.executor_s, self.label, self.rows,
                        self.swaps, self.after_idle, knee, graph_batch)

    def observation(self, executor_predicted_s: float) -> Observation:
        """What the loop's coefficients must explain in this step.

        A step's time outside the executor is measured exactly (``step - elapsed``). After
        an idle gap the executor itself also runs slower (cold caches) than the grid,
        which ran back to back, timed it: there the step is measured against the
        executor model's prediction, so ``idle_starts`` carries the whole cold penalty.
        """
        idle = bool(self.shape.idle_starts)
        executor = executor_predicted_s if idle else self.executor_s
        return Observation(self.shape, self.step_s - executor, self.label,
                           "idle start" if idle else self.shape.kind)


class _Recorder:
    """Engine observer: one ``HostStep`` per iteration."""

    def __init__(self) -> None:
        self.steps: list[HostStep] = []

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        self.steps.append(HostStep(shape_of(out), engine.last_step_s, elapsed_s,
                                   f"step {engine.num_steps}", tuple(output_rows(out)),
                                   (len(out.swap_out), len(out.swap_in)), out.after_idle,
                                   out.decode_knee, out.graph_batch))

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None: ...
    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None: ...
    def on_finished(self, req: Request, now: float) -> None: ...


def burst_sizes(max_num_seqs: int, quick: bool) -> list[int]:
    return [1, max(2, max_num_seqs // 2)] if quick else \
        [1, max(2, max_num_seqs // 4), max(2, max_num_seqs // 2), max_num_seqs]


IDLE_GAP_S = 0.02  # long enough for the OS to run something else on a busy machine


def idle_probes(quick: bool) -> int:
    return 4 if quick else 10


def measure_host(executor: TimedExecutor, config: EngineConfig, *, max_context: int,
                 quick: bool = False, seed: int = 0, model_name: str = "calibration",
                 progress: Callable[[str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 decode_knee: int | None = None,
                 graph_batch: int | None = None,
                 clock: Clock | None = None) -> list[HostStep]:
    """Serve bursts of requests, then single ones after idle gaps; every step's times
    (on ``clock``, the engine's wall clock unless given)."""
    recorder = _Recorder()
    metrics = EngineMetrics(model_name)
    engine = LLMEngine(config, executor, executor.num_gpu_blocks, executor.num_cpu_blocks,
                       clock=clock, observers=[MetricsObserver(metrics), recorder],
                       decode_knee=decode_knee, graph_batch=graph_batch)
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
    for _ in range(idle_probes(quick)):
        sleep(IDLE_GAP_S)
        prompt = [3 + rng.randrange(50) for _ in range(rng.randint(16, 64))]
        engine.add_request(Request(f"host{n}", prompt, SamplingParams(
            max_tokens=4, ignore_eos=True)))
        n += 1
        while engine.has_work():
            engine.step()
            if progress is not None:
                progress("engine loop: after an idle gap")
    return recorder.steps


def expected_steps(max_num_seqs: int, quick: bool) -> int:
    """Roughly how many steps ``measure_host`` runs (for a progress bar's total)."""
    outputs = 8 if quick else 16
    return (sum(outputs + 1 + b // 4 for b in burst_sizes(max_num_seqs, quick))
            + 4 * idle_probes(quick))
