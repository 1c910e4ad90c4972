"""Measured against predicted: latency percentiles per class, throughput, iterations.

Relative errors are ``|predicted - measured| / measured``. Two iteration errors are kept
apart because they answer different questions: ``iteration`` compares each real
iteration's step time with the profile's prediction for that very shape (is the cost
model right?), while the latency percentiles compare two whole runs (is the twin right,
scheduling feedback included?). ``executor`` narrows the first to the forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from slopilot.engine.calibrate.replay import Iteration, Recorder
from slopilot.engine.request import Priority
from slopilot.engine.sim.calibrated import CalibratedCostModel

PERCENTILES = (("ttft", 50), ("ttft", 99), ("tbt", 50), ("tbt", 99))


def rel_err(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else float("inf")


@dataclass
class ClassFigures:
    requests: int
    measured: dict[str, float]  # "ttft_p50" -> seconds
    predicted: dict[str, float]
    measured_interval: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``bootstrap_intervals``: where each measured figure could as well have fallen."""
    sensitivity: dict[str, float] = field(default_factory=dict)
    """``sensitivity``: how far the twin's own figure moves when every iteration is a
    little slower or faster (a small error of the cost model, as a ratio of the figure)."""

    def errors(self) -> dict[str, float]:
        return {k: rel_err(self.predicted[k], v) for k, v in self.measured.items()}

    def sensitive(self, limit: float) -> set[str]:
        """The figures that a cost model this close could still miss by over ``limit``."""
        return {k for k, v in self.sensitivity.items() if v > limit}

    def within_interval(self) -> dict[str, bool]:
        """Whether each prediction lies inside its measurement's interval: an error the
        run's own sampling could have made."""
        return {k: lo <= self.predicted[k] <= hi
                for k, (lo, hi) in self.measured_interval.items() if k in self.predicted}


@dataclass
class IterationFit:
    count: int
    mape: float  # step time: executor and engine loop
    executor_mape: float
    median_err: float
    by_kind: dict[str, tuple[int, float]] = field(default_factory=dict)
    worst: list[tuple[str, float, float]] = field(default_factory=list)
    """(kind and shape, measured s, predicted s) of the largest errors."""
    noise_floor: float | None = None
    """``repeat_noise``: the error any shape-to-time model has on this run's iterations."""
    noise_count: int = 0


@dataclass
class LoadReport:
    name: str
    rate: float
    requests: int
    classes: dict[str, ClassFigures]
    throughput: tuple[float, float]  # measured, predicted output tokens per second
    preemptions: tuple[int, int]
    busy: tuple[float, float]  # share of the run the engine was iterating
    iterations: IterationFit
    points: list[tuple[float, float, str]]  # every real iteration: measured, predicted, kind
    shapes: list[tuple[float, ...]] = field(default_factory=list)
    """Every real iteration's features (``IterationShape.vector``), in ``points`` order:
    another profile's prediction can be judged on the same run afterwards."""
    ends: list[float] = field(default_factory=list)
    """Every real iteration's end on the run's clock, in ``points`` order: the windows a
    live correction would have summed them into (``correction.windows_of``)."""
    cpu_share: float = 1.0
    load_average: float | None = None
    truncated: bool = False  # the real run hit its time limit: figures are not comparable

    def worst_error(self) -> float:
        return max((e for c in self.classes.values() for e in c.errors().values()),
                   default=0.0)


def _class_values(rec: Recorder, priority: int) -> tuple[list[str], np.ndarray,
                                                          list[np.ndarray]]:
    ids = [r for r, p in rec.priority.items() if p == priority]
    return (ids, np.array([rec.ttft[r] for r in ids]),
            [np.asarray(rec.gaps.get(r, ()), dtype=float) for r in ids])


def _figures(ttft: np.ndarray, gaps: list[np.ndarray]) -> dict[str, float]:
    joined = np.concatenate(gaps) if gaps else np.zeros(0)
    out = {}
    for metric, q in PERCENTILES:
        values = ttft if metric == "ttft" else joined
        if values.size:
            out[f"{metric}_p{q}"] = float(np.percentile(values, q))
    return out


def _percentiles(rec: Recorder, priority: int) -> tuple[int, dict[str, float]] | None:
    ids, ttft, gaps = _class_values(rec, priority)
    if not ids:
        return None
    return len(ids), _figures(ttft, gaps)


def sensitivity(base: Recorder, moved: Sequence[Recorder]) -> dict[str, dict[str, float]]:
    """Per class and figure, the largest relative move of any ``moved`` run's figure from
    ``base``'s: the same requests through the twin with every iteration slower or faster.

    Near saturation a queue's waits grow like 1 / (1 - utilization), so a figure can move
    many times more than the iterations did; a prediction of such a figure within 10 %
    needs a cost model far closer than the iterations' own noise, and its error says
    little about the cost model. A figure missing from a moved run counts as moved
    without bound."""
    out: dict[str, dict[str, float]] = {}
    for p in Priority:
        b = _percentiles(base, int(p))
        if b is None:
            continue
        others = [_percentiles(m, int(p)) for m in moved]
        out[p.label] = {k: max((rel_err(o[1][k], v) if o is not None and k in o[1]
                                else float("inf") for o in others), default=0.0)
                        for k, v in b[1].items()}
    return out


BOOTSTRAP_ROUNDS = 400
INTERVAL = 0.90


def bootstrap_intervals(rec: Recorder, priority: int, *, rounds: int = BOOTSTRAP_ROUNDS,
                        seed: int = 0) -> dict[str, tuple[float, float]]:
    """The central ``INTERVAL`` of each figure over ``rounds`` resamplings of the class's
    requests (with replacement; a request's token gaps go with it, as they are not
    independent of each other): how far the measurement itself could have landed had the
    same traffic sent other requests of the same kind."""
    ids, ttft, gaps = _class_values(rec, priority)
    if len(ids) < 2:
        return {}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(rounds):
        pick = rng.integers(0, len(ids), len(ids))
        for k, v in _figures(ttft[pick], [gaps[i] for i in pick]).items():
            draws.setdefault(k, []).append(v)
    tail = 100 * (1 - INTERVAL) / 2
    return {k: (float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail)))
            for k, v in draws.items()}


def _throughput(rec: Recorder, first_arrival: float) -> float:
    tokens = len(rec.ttft) + sum(len(g) for g in rec.gaps.values())
    if not rec.finished:
        return 0.0
    span = max(rec.finished.values()) - first_arrival
    return tokens / span if span > 0 else 0.0


NOISE_MIN_ALIKE = 5
NOISE_CONTEXT_TOKENS = 32
"""Context read within one bucket of this many tokens counts as the same shape: on
SmolLM2-CPU 32 more tokens of every decode's context cost about 1 % of a step."""


def repeat_noise(iterations: Sequence[Iteration]) -> tuple[float | None, int]:
    """Mean ``|t - median| / t`` over iterations of one shape (at least
    ``NOISE_MIN_ALIKE`` alike), and over how many: the error even a perfect model of
    shape to time has on this machine, since it can predict a shape's one time only.

    A real engine seldom repeats a shape exactly (every decode reads one token more
    context each step), so the batch's counts are matched exactly and its context reads
    within ``NOISE_CONTEXT_TOKENS``."""
    groups: dict[tuple[float, ...], list[float]] = {}
    for it in iterations:
        s = it.shape
        key = (s.tokens, s.decode_seqs, s.prefill_seqs, s.sampled, s.swap_blocks,
               s.idle_starts, *(v // NOISE_CONTEXT_TOKENS for v in (
                   s.decode_context, s.decode_padded_context, s.prefill_context)))
        groups.setdefault(key, []).append(it.step_s)
    errors = [abs(t - m) / t for times in groups.values() if len(times) >= NOISE_MIN_ALIKE
              for m in (float(np.median(times)),) for t in times if t > 0]
    return (float(np.mean(errors)) if errors else None), len(errors)


def iteration_fit(rec: Recorder, cost: CalibratedCostModel) -> tuple[IterationFit, list]:
    measured = np.array([it.step_s for it in rec.iterations])
    predicted = np.array([cost.shape_time(it.shape) for it in rec.iterations])
    executor = np.array([it.executor_s for it in rec.iterations])
    executor_pred = np.array([cost.executor_time(it.shape) for it in rec.iterations])
    kinds = [it.shape.kind for it in rec.iterations]
    if not len(measured):
        return IterationFit(0, 0.0, 0.0, 0.0), []
    err = np.abs(predicted - measured) / measured
    by_kind = {k: (int(sum(1 for x in kinds if x == k)),
                   float(np.mean([e for e, x in zip(err, kinds, strict=True) if x == k])))
               for k in dict.fromkeys(kinds)}
    worst = [(f"{kinds[i]} {_describe(rec.iterations[i].shape)}", float(measured[i]),
              float(predicted[i])) for i in np.argsort(-err)[:5]]
    floor, alike = repeat_noise(rec.iterations)
    fit = IterationFit(len(measured), float(err.mean()),
                       float(np.mean(np.abs(executor_pred - executor) / executor)),
                       float(np.median(err)), by_kind, worst, floor, alike)
    points = list(zip(measured.tolist(), predicted.tolist(), kinds, strict=True))
    return fit, points


def _describe(s: object) -> str:
    from slopilot.engine.sim.shape import IterationShape

    if not isinstance(s, IterationShape):
        return ""
    return (f"tokens={s.tokens:g} decodes={s.decode_seqs:g} chunks={s.prefill_seqs:g} "
            f"ctx={s.context_tokens:g} padded={s.decode_padded_context:g}"
            f"{f' spill={s.decode_spill:g}' if s.decode_spill else ''}")


def compare(name: str, rate: float, real: Recorder, sim: Recorder,
            cost: CalibratedCostModel, *, first_arrival_real: float,
            real_span_s: float, sim_span_s: float,
            first_arrival_sim: float = 0.0) -> LoadReport:
    """``real`` against ``sim``, each figure's error relative to ``real``'s.

    ``sim`` may be a second real run of the same requests (``first_arrival_sim`` its
    start on the wall clock): then the errors are the engine's own repeatability, what
    no twin can be held below on the machine that ran it."""
    classes = {}
    for p in Priority:
        m, s = _percentiles(real, int(p)), _percentiles(sim, int(p))
        if m is None or s is None:
            continue
        keys = sorted(set(m[1]) & set(s[1]))
        interval = bootstrap_intervals(real, int(p))
        classes[p.label] = ClassFigures(m[0], {k: m[1][k] for k in keys},
                                        {k: s[1][k] for k in keys},
                                        {k: interval[k] for k in keys if k in interval})
    fit, points = iteration_fit(real, cost)
    busy_real = sum(it.step_s for it in real.iterations) / real_span_s if real_span_s else 0
    busy_sim = sum(it.step_s for it in sim.iterations) / sim_span_s if sim_span_s else 0
    return LoadReport(
        name=name, rate=rate, requests=len(real.ttft), classes=classes,
        throughput=(_throughput(real, first_arrival_real),
                    _throughput(sim, first_arrival_sim)),
        preemptions=(sum(it.preempted for it in real.iterations),
                     sum(it.preempted for it in sim.iterations)),
        busy=(busy_real, busy_sim), iterations=fit, points=points,
        shapes=[it.shape.vector() for it in real.iterations],
        ends=[it.end for it in real.iterations])
