"""``calibrate()``: time an executor over the grid and the engine loop, fit, make a profile.

The steps, each reported to ``progress``: fill and warm the KV cache, time every shape
``repeats`` times, serve a few bursts through the engine loop, fit the executor's
coefficients and then the loop's, and check both fits against ``tolerance`` (mean
relative error per iteration; the loop's of the whole step). A fit outside it raises
``FitError`` naming the worst shapes or steps and how noisy the machine was; nothing is
written then.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from slopilot import __version__
from slopilot.engine.calibrate.design import GridOptions, design
from slopilot.engine.calibrate.fit import (
    FitError,
    FitResult,
    Observation,
    check_determined,
    fit_host,
    fit_shapes,
)
from slopilot.engine.calibrate.harness import Harness, Sample, TimedExecutor
from slopilot.engine.calibrate.host import HostStep, expected_steps, measure_host
from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import Clock
from slopilot.engine.sim.profile_file import (
    CostProfile,
    DeviceInfo,
    FitReport,
    executor_code_hash,
)
from slopilot.engine.sim.profiles import ModelProfile
from slopilot.engine.sim.shape import FEATURES, decode_knee_tokens


@dataclass(frozen=True)
class CalibrationOptions:
    grid: GridOptions = field(default_factory=GridOptions)
    repeats: int = 5
    tolerance: float = 0.10  # largest accepted mean relative error per iteration, both fits
    host: bool = True  # also time the engine loop around the executor
    seed: int = 0
    statistic: str = "median"  # or "min": see harness.py

    def __post_init__(self) -> None:
        if not 1 <= self.repeats <= 100:
            raise ValueError(f"--repeats {self.repeats}: expected 1 to 100")
        if not 0 < self.tolerance <= 10:
            raise ValueError(f"--tolerance {self.tolerance}: expected a fraction in (0, 10]")


@dataclass(frozen=True)
class Calibration:
    """Everything a run produced: the profile and the evidence behind it."""

    profile: CostProfile
    executor_fit: FitResult
    host_fit: FitResult | None
    samples: list[Sample]
    host_steps: list[HostStep]


@dataclass(frozen=True)
class Target:
    """The executor to calibrate and what the profile should say about it."""

    executor: TimedExecutor
    model: ModelProfile
    device: DeviceInfo
    dtype: str
    kv_cache_bytes: int
    versions: dict[str, str] = field(default_factory=dict)
    # What the engine loop's steps are timed on. None: the wall clock, on which a real
    # executor times itself, so each step holds its executor's time. An executor that
    # reports made-up times (a test's) needs a clock that counts them.
    clock: Clock | None = None


@dataclass(frozen=True)
class Recording:
    """The timings of one calibration run, before any fit: what ``--samples-out``
    keeps and ``--refit`` fits again (each shape's rows, not its features, so a new
    form recomputes its features from them)."""

    model: ModelProfile
    device: DeviceInfo
    dtype: str
    kv_cache_bytes: int
    block_size: int
    versions: dict[str, str]
    executor_code: str
    grid: GridOptions
    repeats: int
    statistic: str
    samples: list[Sample]
    host_steps: list[HostStep]
    seconds: float
    cpu_share: float | None
    load_average: float | None
    created: str = ""

    @property
    def decode_knee(self) -> int | None:
        per_layer = self.model.kv_bytes_per_token // self.model.num_layers
        return decode_knee_tokens(self.device.cache_bytes, per_layer)

    @property
    def graph_batch(self) -> int | None:
        return self.device.graph_batch


def total_steps(opts: CalibrationOptions, executor: TimedExecutor) -> int:
    specs = design(opts.grid)
    harness = Harness(executor, specs, max_context=opts.grid.max_context, repeats=opts.repeats)
    host = expected_steps(opts.grid.max_num_seqs, opts.grid.quick) if opts.host else 0
    return harness.steps + host


def calibrate(target: Target, opts: CalibrationOptions,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Time ``target`` and fit it (``measure`` then ``fit_recording``)."""
    return fit_recording(measure(target, opts, progress), opts.tolerance, host=opts.host)


def measure(target: Target, opts: CalibrationOptions,
            progress: Callable[[str], None] | None = None) -> Recording:
    """Time the grid and the engine loop; no fit."""
    started = time.perf_counter()
    cpu0 = time.process_time()
    grid = opts.grid
    harness = Harness(target.executor, design(grid), max_context=grid.max_context,
                      repeats=opts.repeats, seed=opts.seed, progress=progress,
                      statistic=opts.statistic)
    samples = harness.run()
    steps: list[HostStep] = []
    if opts.host:
        config = EngineConfig(token_budget=grid.token_budget, budget_align=1,
                              chunk_size=min(grid.token_budget, 512),
                              max_num_seqs=grid.max_num_seqs)
        per_layer = target.model.kv_bytes_per_token // target.model.num_layers
        steps = measure_host(target.executor, config, max_context=grid.max_context,
                             quick=grid.quick, seed=opts.seed, model_name=target.model.name,
                             progress=progress,
                             decode_knee=decode_knee_tokens(target.device.cache_bytes,
                                                            per_layer),
                             graph_batch=target.device.graph_batch, clock=target.clock)
    seconds = time.perf_counter() - started
    share = (time.process_time() - cpu0) / seconds if seconds > 0 else None
    return Recording(
        model=target.model, device=target.device, dtype=target.dtype,
        kv_cache_bytes=target.kv_cache_bytes, block_size=target.executor.block_size,
        versions={"slopilot": __version__, "python": platform.python_version(),
                  **target.versions},
        executor_code=executor_code_hash(), grid=grid, repeats=opts.repeats,
        statistic=opts.statistic, samples=samples, host_steps=steps, seconds=seconds,
        cpu_share=share, load_average=_load_average(),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))


def with_statistic(rec: Recording, statistic: str) -> Recording:
    """The recording with each shape's figure retaken from its rounds (median or min)."""
    if statistic not in ("median", "min"):
        raise ValueError(f"--statistic {statistic!r}: use median or min")
    pick = min if statistic == "min" else statistics.median
    samples = [dataclasses.replace(s, seconds=pick(s.times)) if s.times else s
               for s in rec.samples]
    return dataclasses.replace(rec, samples=samples, statistic=statistic)


def fit_recording(rec: Recording, tolerance: float = 0.10, *,
                  host: bool = True) -> Calibration:
    """Fit today's form to a recording (fresh, or read back by ``--refit``): features
    recomputed from each shape's rows; a mean error above ``tolerance``, of the
    executor's fit or of the engine loop's, is a FitError."""
    knee, graphs = rec.decode_knee, rec.graph_batch
    samples = rec.samples
    observations = [Observation(s.spec.shape_at(knee, graphs), s.seconds, s.spec.describe(),
                                s.spec.group) for s in samples]
    check_determined(observations)
    executor_fit = fit_shapes(observations)
    if executor_fit.mape > tolerance:
        raise FitError(_too_far(executor_fit, tolerance, samples))
    host_fit = None
    steps = [s.reshaped(knee, graphs) for s in rec.host_steps] if host else []
    if steps:
        executor_coef = [executor_fit.coefficients[f] for f in FEATURES]
        predicted = [sum(c * v for c, v in zip(executor_coef, s.shape.vector(), strict=True))
                     for s in steps]
        host_fit = fit_host([s.observation(p) for s, p in zip(steps, predicted, strict=True)],
                            [s.step_s for s in steps])
        # Judged as the executor's is: a token gap is the whole step, so a loop fitted 84 %
        # off (executor times that were not these steps') mispredicts every gap as much.
        if host_fit.mape > tolerance:
            raise FitError(_loop_too_far(host_fit, tolerance, steps, rec))
    grid = rec.grid
    report = FitReport(
        repeats=rec.repeats, shapes=len(samples), mape=executor_fit.mape,
        max_err=executor_fit.max_err, classes=MappingProxyType(dict(executor_fit.classes)),
        host_steps=len(steps), host_mape=host_fit.mape if host_fit else 0.0,
        cpu_share=rec.cpu_share, load_average=rec.load_average, seconds=rec.seconds,
        token_budget=grid.token_budget, max_num_seqs=grid.max_num_seqs,
        max_context=grid.max_context, statistic=rec.statistic)
    host_coef = {k: v for k, v in (host_fit.coefficients.items() if host_fit else ()) if v}
    profile = CostProfile(
        name=f"{rec.model.name} on {rec.device.type} ({rec.dtype})",
        device=rec.device, model=rec.model, dtype=rec.dtype,
        executor=MappingProxyType(dict(executor_fit.coefficients)),
        host=MappingProxyType(host_coef), block_size=rec.block_size,
        kv_cache_bytes=rec.kv_cache_bytes,
        created=rec.created or datetime.datetime.now(datetime.UTC).isoformat(
            timespec="seconds"),
        versions=MappingProxyType(dict(rec.versions)),
        executor_code=rec.executor_code, fit=report)
    return Calibration(profile, executor_fit, host_fit, samples, steps)


def _too_far(fit: FitResult, tolerance: float, samples: list[Sample]) -> str:
    worst = "; ".join(f"{o.label} ({o.group}): measured {o.seconds * 1e3:.2f} ms, fitted "
                      f"{p * 1e3:.2f} ms ({e:+.0%})" for o, p, e in fit.worst(5))
    spread = statistics.median(s.spread for s in samples)
    share = statistics.median(s.cpu_share for s in samples)
    load = _load_average()
    noisy = spread > 0.1 or share < 0.9
    hint = (f"the timings were noisy (median spread {spread:.0%} between repeats, the "
            f"process got {share:.0%} of a core, load average {load}): rerun on a quieter "
            "machine or with more --repeats" if noisy else
            "the timings were steady, so the cost model's form misses these shapes: "
            "report it with the profile's table")
    return (f"the fit's mean error per iteration is {fit.mape:.1%}, above --tolerance "
            f"{tolerance:g}; worst shapes: {worst}. {hint}; or accept it with "
            f"--tolerance {max(fit.mape * 1.2, tolerance):.2f}. Nothing was written.")


def _loop_too_far(fit: FitResult, tolerance: float, steps: list[HostStep],
                  rec: Recording) -> str:
    worst = "; ".join(
        f"{steps[i].label} ({fit.observations[i].group}): measured "
        f"{steps[i].step_s * 1e3:.2f} ms, fitted {fit.predicted[i] * 1e3:.2f} ms "
        f"({fit.errors[i]:+.0%})" for i in sorted(range(len(steps)),
                                                   key=lambda i: -abs(fit.errors[i]))[:5])
    share = rec.cpu_share
    spread = statistics.median(s.spread for s in rec.samples)
    # Each step is timed once (the grid's shapes, several rounds): a busy machine shows
    # in the grid's spread and in the share of a core the process got.
    noisy = spread > 0.1 or (share is not None and share < 0.9)
    shown = "-" if share is None else f"{share:.0%}"
    hint = (f"each step is timed once and the machine was busy (the grid's rounds spread "
            f"{spread:.0%}, the process got {shown} of a core, load average "
            f"{rec.load_average}): rerun on a quieter machine" if noisy else
            "the machine was steady, so the loop's time does not follow these steps' "
            "shapes: a samples file edited by hand, or a loop cost the form has no "
            "feature for (report it with this message)")
    return (f"the engine loop's fit: mean error per step {fit.mape:.1%}, above --tolerance "
            f"{tolerance:g} (each step's whole time: its executor as measured, the loop as "
            f"fitted); worst steps: {worst}. {hint}; or accept it with --tolerance "
            f"{max(fit.mape * 1.2, tolerance):.2f}, or leave the loop out with --no-host. "
            "Nothing was written.")


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
