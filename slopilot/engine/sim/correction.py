"""Checking a profile against live iterations, and rescaling or refitting it.

The engine exports, per kind of iteration, the summed step time
(``slopilot_iteration_seconds_sum``) and the summed shape features
(``slopilot_iteration_shape_total``). Because the cost model is linear in its features,
the increase of those counters over any window is one equation the profile must satisfy::

    predicted(window, kind) = sum_f coefficient_f * increase(shape_total{kind, feature=f})
    measured(window, kind)  = increase(seconds_sum{kind})

``twin_error`` is the relative error of the summed prediction; ``rescaled`` multiplies
every coefficient by one factor (the cheap correction: right when the device is uniformly
faster or slower than calibrated); ``refit`` solves for one factor per feature from many
(window, kind) equations, pulled towards 1 so that a few windows cannot move features
they barely exercise (a ridge towards the calibrated profile, in relative terms).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.sim.profile_file import CostProfile
from slopilot.engine.sim.shape import FEATURES, KINDS, IterationShape


@dataclass(frozen=True)
class WindowSample:
    """One kind's iterations over one window (on one replica, or summed over several)."""

    kind: str
    iterations: float
    seconds: float  # summed step time, measured
    shape: IterationShape  # summed features


def predicted_seconds(profile: CostProfile, shape: IterationShape) -> float:
    return sum(profile.coefficient(f) * v for f, v in zip(FEATURES, shape.vector(),
                                                           strict=True))


def twin_error(profile: CostProfile, samples: Sequence[WindowSample]) -> float:
    """(predicted - measured) / measured of the samples' total step time."""
    measured = sum(s.seconds for s in samples)
    if measured <= 0:
        raise ValueError("no measured iteration time in these samples")
    return (sum(predicted_seconds(profile, s.shape) for s in samples) - measured) / measured


def rescaled(profile: CostProfile, factor: float, *, note: str = "") -> CostProfile:
    """Every coefficient times ``factor``; the source says it was corrected."""
    if not factor > 0:
        raise ValueError(f"factor={factor!r}: must be positive")
    return _scaled(profile, dict.fromkeys(FEATURES, factor),
                   note or f"rescaled x{factor:.3g}")


PRIOR_WEIGHT = 0.1
"""The refit's pull towards the calibrated profile (``benchmarks/correction_transfer.py``
measures what a stronger one trades: less carried into another load, a looser fit at
this one)."""


def refit(profile: CostProfile, samples: Sequence[WindowSample], *,
          prior_weight: float = PRIOR_WEIGHT) -> CostProfile:
    """Per-feature factors fitted to ``samples`` (relative error), pulled towards 1."""
    from scipy.optimize import lsq_linear

    if isinstance(prior_weight, bool) or not prior_weight >= 0 or not np.isfinite(prior_weight):
        raise ValueError(f"prior_weight={prior_weight!r}: expected a finite number >= 0 "
                         f"(0: no pull towards the profile; the controller uses {PRIOR_WEIGHT})")
    rows = [s for s in samples if s.seconds > 0]
    if not rows:
        raise ValueError("no window with measured iteration time to refit on")
    active = [f for f in FEATURES if profile.coefficient(f) > 0]
    prior = np.array([profile.coefficient(f) for f in active])
    index = [FEATURES.index(f) for f in active]
    a = np.array([[s.shape.vector()[i] for i in index] for s in rows]) * prior
    y = np.array([s.seconds for s in rows])
    a, b = a / y[:, None], np.ones(len(rows))
    ridge = np.sqrt(prior_weight) * np.eye(len(active))
    res = lsq_linear(np.vstack([a, ridge]), np.concatenate([b, np.sqrt(prior_weight)
                                                            * np.ones(len(active))]),
                     bounds=(0.0, np.inf))
    factors = dict(zip(active, (float(v) for v in res.x), strict=True))
    return _scaled(profile, factors, f"refit on {len(rows)} windows")


def corrected(profile: CostProfile, samples: Sequence[WindowSample], *,
              refit_first: bool = True, prior_weight: float = PRIOR_WEIGHT) -> CostProfile:
    """The live correction: ``refit`` (when ``refit_first``), then one factor on the sum.
    The refit's pull towards the profile leaves the total off by what the prior held
    back; the factor puts the window's total right."""
    if refit_first:
        profile = refit(profile, samples, prior_weight=prior_weight)
    mode = "refit" if refit_first else "rescale"
    return rescaled(profile, 1.0 / (1.0 + twin_error(profile, samples)),
                    note=f"{mode} on the live window")


def factors(base: CostProfile, moved: CostProfile) -> dict[str, float]:
    """Per feature ``base`` prices, how many times its cost ``moved`` puts on it: what a
    correction learned (1.0 where it left the feature alone)."""
    return {f: moved.coefficient(f) / base.coefficient(f) for f in FEATURES
            if base.coefficient(f) > 0}


MOVED = 0.05
"""A factor further than this from 1 is a feature the correction moved (the rest is noise
a few windows leave behind)."""


def describe_factors(learned: Mapping[str, float], *, shown: int = 4) -> str:
    """``learned`` (``factors``) in a line, the features moved furthest (in ratio) first, e.g.
    ``tokens x1.74, prefill_seqs x1.53 and 2 more (the others within 5%)``."""
    def size(v: float) -> float:  # x0.5 moves a feature as far as x2
        return abs(math.log(v)) if v > 0 else math.inf

    moved = [f"{f} x{v:.2f}" for f, v in sorted(learned.items(), key=lambda kv: -size(kv[1]))
             if abs(v - 1) > MOVED]
    if not moved:
        return f"every feature within {MOVED:.0%}"
    more = f" and {len(moved) - shown} more" if len(moved) > shown else ""
    return f"{', '.join(moved[:shown])}{more} (the others within {MOVED:.0%})"


def windows_of(iterations: Sequence[tuple[float, float, IterationShape]],
               window_s: float) -> list[WindowSample]:
    """Iterations ``(end time, step seconds, shape)`` summed per window of ``window_s``
    and kind: the equations the engine's counters give over the same windows."""
    if not window_s > 0:
        raise ValueError(f"window_s={window_s!r}: must be positive")
    sums: dict[tuple[int, str], tuple[int, float, np.ndarray]] = {}
    for end, seconds, shape in iterations:
        key = (int(end // window_s), shape.kind)
        n, total, vector = sums.get(key, (0, 0.0, np.zeros(len(FEATURES))))
        sums[key] = (n + 1, total + seconds, vector + np.asarray(shape.vector()))
    return [WindowSample(kind, float(n), total, IterationShape(*(float(v) for v in vector)))
            for (_, kind), (n, total, vector) in sorted(sums.items())]


def _scaled(profile: CostProfile, factors: dict[str, float], note: str) -> CostProfile:
    def scale(coefficients: Mapping[str, float]) -> MappingProxyType[str, float]:
        return MappingProxyType({k: v * factors.get(k, 1.0)
                                 for k, v in coefficients.items()})

    return dataclasses.replace(profile, executor=scale(profile.executor),
                               host=scale(profile.host), source=f"{profile.source} ({note})")


def window_samples(before: str, after: str) -> list[WindowSample]:
    """Per-kind increases between two scrapes of one engine's /metrics text."""
    a, b = _read(before), _read(after)
    out = []
    for kind in KINDS:
        count = b.get((kind, "count"), 0.0) - a.get((kind, "count"), 0.0)
        if count <= 0:
            continue
        seconds = b.get((kind, "sum"), 0.0) - a.get((kind, "sum"), 0.0)
        shape = IterationShape(*(b.get((kind, f), 0.0) - a.get((kind, f), 0.0)
                                 for f in FEATURES))
        out.append(WindowSample(kind, count, seconds, shape))
    return out


def _read(text: str) -> dict[tuple[str, str], float]:
    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "slopilot_iteration_seconds":
            for s in family.samples:
                if s.name.endswith(("_sum", "_count")):
                    key = (s.labels["kind"], s.name.rsplit("_", 1)[-1])
                    values[key] = values.get(key, 0.0) + s.value
        elif family.name == "slopilot_iteration_shape":
            for s in family.samples:
                key = (s.labels["kind"], s.labels["feature"])
                values[key] = values.get(key, 0.0) + s.value
    return values
