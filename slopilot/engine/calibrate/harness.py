"""Time the real executor on hand-built iterations, through its public ``execute()``.

Every row of a batch gets its own blocks for its whole context, as in serving, so the
reads timed are the reads a server makes (a shared context could sit in cache after
the first row; on SmolLM2 the two timed alike, but a smaller model's might not). Before
timing, swap-ins write every block of the pool once (a
never-written page reads the kernel's shared zero page, always in cache: too fast).
Then each shape runs once unmeasured (kernel caches warm), and ``repeats`` rounds run
every shape in a fresh random order (load that drifts on a shared machine then spreads
over all shapes instead of biasing a few); each shape's figure is the median of its
rounds (``statistic="min"`` takes the fastest round instead: on a machine shared with
busy neighbours that estimates the undisturbed time, for checking the cost model's
form; the median is what a server will see).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slopilot.engine.calibrate.design import ShapeSpec
from slopilot.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams

_GREEDY = SamplingParams(max_tokens=1, ignore_eos=True)
STATISTICS = ("median", "min")
_FILL_BATCH = 64  # blocks per swap-in of the fill


class TimedExecutor(Protocol):
    """What the harness needs: the engine's executor interface plus its cache size."""

    @property
    def block_size(self) -> int: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def num_cpu_blocks(self) -> int: ...
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput: ...


class HarnessError(ValueError):
    """The executor's cache cannot hold the grid; the message says what to change."""


@dataclass(frozen=True)
class Sample:
    spec: ShapeSpec
    seconds: float  # executor time over the rounds: their median (or minimum)
    spread: float  # interquartile range / median: this shape's noise
    cpu_share: float  # thread CPU time / wall time: 1 on an idle core
    times: tuple[float, ...] = ()
    cpu_seconds: float = 0.0  # median thread CPU time (the work without the wait)
    cpu_times: tuple[float, ...] = ()


def _row_blocks(n: int, c: int, bs: int) -> int:
    return -(-(c + n) // bs)


@dataclass(frozen=True)
class BlockPlan:
    """Block tables for the grid: every row its own blocks, as in serving."""

    block_size: int
    total: int  # blocks the largest shape needs
    cpu_blocks: int  # host blocks: the swap shapes' and the fill's

    @classmethod
    def for_specs(cls, specs: Sequence[ShapeSpec], block_size: int) -> BlockPlan:
        need = max((sum(_row_blocks(n, c, block_size) for n, c, _ in s.rows)
                    for s in specs), default=0)
        swaps = max((max(s.swap_out, s.swap_in) for s in specs), default=0)
        return cls(block_size, max(need, swaps, 1), max(swaps, _FILL_BATCH))

    def output(self, spec: ShapeSpec) -> SchedulerOutput:
        bs = self.block_size
        out = SchedulerOutput()
        free = iter(range(self.total))
        for i, (n, c, sample) in enumerate(spec.rows):
            table = [next(free) for _ in range(_row_blocks(n, c, bs))]
            out.seqs.append(ScheduledSeq(f"cal{i}", _tokens(n, i), c, table, sample, _GREEDY))
        out.num_batched_tokens = sum(n for n, _, _ in spec.rows)
        out.num_decode_tokens = sum(1 for n, _, _ in spec.rows if n == 1)
        out.num_prefill_tokens = out.num_batched_tokens - out.num_decode_tokens
        out.swap_out = [(g, g) for g in range(spec.swap_out)]
        out.swap_in = [(g, g) for g in range(spec.swap_in)]
        return out

    def fill(self) -> list[SchedulerOutput]:
        """Swap-ins that write every block of the pool once (host blocks hold zeros)."""
        outs = []
        for first in range(0, self.total, _FILL_BATCH):
            blocks = range(first, min(first + _FILL_BATCH, self.total))
            outs.append(SchedulerOutput(swap_in=[(j, g) for j, g in enumerate(blocks)]))
        return outs


def _tokens(n: int, salt: int) -> list[int]:
    # Small ids every vocabulary has; varied so no kernel sees a constant input.
    return [3 + (salt * 7 + j) % 50 for j in range(n)]


class Harness:
    """Runs the grid on one executor; see the module docstring."""

    def __init__(self, executor: TimedExecutor, specs: Sequence[ShapeSpec], *,
                 max_context: int, repeats: int = 5, seed: int = 0,
                 statistic: str = "median",
                 progress: Callable[[str], None] | None = None,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 wall_clock: Callable[[], float] = time.perf_counter) -> None:
        if repeats < 1:
            raise HarnessError(f"--repeats {repeats}: expected at least 1")
        if statistic not in STATISTICS:
            raise HarnessError(f"--statistic {statistic!r}: use one of {', '.join(STATISTICS)}")
        self.statistic = statistic
        self.executor, self.specs = executor, list(specs)
        self.repeats, self.seed = repeats, seed
        self.plan = BlockPlan.for_specs(self.specs, executor.block_size)
        if executor.num_gpu_blocks < self.plan.total:
            raise HarnessError(
                f"the executor's KV cache has {executor.num_gpu_blocks} blocks; the grid "
                f"needs {self.plan.total} (every row of its largest batch its own "
                f"context, up to {max_context} tokens): lower --max-context or "
                "--max-num-seqs, or give the cache more memory (--kv-cache-gb)")
        if executor.num_cpu_blocks < self.plan.cpu_blocks:
            raise HarnessError(
                f"the executor has {executor.num_cpu_blocks} host blocks; calibration needs "
                f"{self.plan.cpu_blocks} (the swap shapes and the cache fill)")
        self._progress = progress or (lambda _: None)
        self._cpu, self._wall = cpu_clock, wall_clock

    @property
    def steps(self) -> int:
        """Executes ``run`` will make (for a progress bar)."""
        return len(self.plan.fill()) + len(self.specs) * (1 + self.repeats)

    def run(self) -> list[Sample]:
        for out in self.plan.fill():
            self.executor.execute(out)
            self._progress("filling the KV cache")
        outs = [self.plan.output(s) for s in self.specs]
        for spec, out in zip(self.specs, outs, strict=True):
            self.executor.execute(out)  # warm-up, not measured
            self._progress(f"warm-up {spec.describe()}")
        times: list[list[float]] = [[] for _ in self.specs]
        shares: list[list[float]] = [[] for _ in self.specs]
        cpus: list[list[float]] = [[] for _ in self.specs]
        rng = random.Random(self.seed)
        for r in range(self.repeats):
            order = list(range(len(self.specs)))
            rng.shuffle(order)
            for i in order:
                c0, w0 = self._cpu(), self._wall()
                result = self.executor.execute(outs[i])
                wall = self._wall() - w0
                cpus[i].append(self._cpu() - c0)
                times[i].append(result.elapsed_s)
                shares[i].append((self._cpu() - c0) / wall if wall > 0 else 1.0)
                self._progress(f"round {r + 1}/{self.repeats}: {self.specs[i].describe()}")
        return [_sample(s, t, sh, c, self.statistic)
                for s, t, sh, c in zip(self.specs, times, shares, cpus, strict=True)]


def _sample(spec: ShapeSpec, times: list[float], shares: list[float],
            cpus: list[float], statistic: str = "median") -> Sample:
    median = statistics.median(times)
    if len(times) >= 4:
        q = statistics.quantiles(times, n=4)
        spread = (q[2] - q[0]) / median if median > 0 else 0.0
    else:
        spread = (max(times) - min(times)) / median if median > 0 else 0.0
    figure = min(times) if statistic == "min" else median
    return Sample(spec, figure, spread, statistics.median(shares), tuple(times),
                  statistics.median(cpus), tuple(cpus))
