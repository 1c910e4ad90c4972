"""Least-squares fit of the cost model's coefficients to measured iterations.

The model is linear in its coefficients (time = c . features), so the fit is a bounded
linear least-squares problem: no start point, no local minima, and it converges for
any data (``scipy.optimize.lsq_linear``). Two choices make it physical and fair:

- **relative error**: each row is divided by its measured time, so a 2 ms decode
  counts as much as a 2 s prefill (the per-iteration error is what is reported);
- **non-negative coefficients**: every feature costs time; none may buy it back;
- **robust to a disturbed shape**: after the plain least-squares solution, a
  ``soft_l1`` refinement (``scipy.optimize.least_squares``, scale 5 %) counts errors
  beyond a few percent linearly, so one shape timed while a neighbour hogged the CPU
  does not drag every coefficient towards it. With clean data both give the same answer.

Columns are scaled to unit size before solving (features span 1 to 10^6) and features
the data never exercises are left out (coefficient 0) rather than guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from slopilot.engine.sim.profile_file import ClassFit
from slopilot.engine.sim.shape import FEATURES, IterationShape

HOST_FEATURES: tuple[str, ...] = ("iteration", "tokens", "sampled", "decode_seqs",
                                  "prefill_seqs", "idle_starts")


class FitError(ValueError):
    """The measurements cannot be fitted; the message names the shapes at fault."""


@dataclass(frozen=True)
class Observation:
    """One measured iteration (or the median of several) and what it was."""

    shape: IterationShape
    seconds: float
    label: str
    group: str


@dataclass(frozen=True)
class FitResult:
    coefficients: dict[str, float]
    predicted: tuple[float, ...]
    errors: tuple[float, ...]  # signed relative errors, (predicted - measured) / measured
    observations: tuple[Observation, ...]
    classes: dict[str, ClassFit]

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(self.errors))) if self.errors else 0.0

    @property
    def max_err(self) -> float:
        return float(np.max(np.abs(self.errors))) if self.errors else 0.0

    def worst(self, k: int = 5) -> list[tuple[Observation, float, float]]:
        """The k observations with the largest error: (observation, predicted, error)."""
        order = np.argsort(-np.abs(np.asarray(self.errors)))[:k]
        return [(self.observations[i], self.predicted[i], self.errors[i]) for i in order]


def fit_shapes(observations: Sequence[Observation],
               features: Sequence[str] = FEATURES) -> FitResult:
    """Coefficients minimising the relative error of ``observations``."""
    obs = list(observations)
    _check_measurements(obs)
    y = np.array([o.seconds for o in obs])
    coef = _solve(obs, y, 1.0 / y, features)
    return _result(obs, y, coef, features)


def fit_host(observations: Sequence[Observation], step_seconds: Sequence[float],
             features: Sequence[str] = HOST_FEATURES) -> FitResult:
    """Engine-loop coefficients: ``observations`` hold each step's time beyond the
    executor model's (which may be slightly negative from noise); each row is weighted
    by its whole step time, so the result minimises the relative error of the step."""
    obs = list(observations)
    steps = np.array(step_seconds, dtype=float)
    if len(steps) != len(obs) or not np.all(np.isfinite(steps)) or np.any(steps <= 0):
        raise FitError("host fit: every step needs a positive, finite step time")
    y = np.array([o.seconds for o in obs])
    coef = _solve(obs, y, 1.0 / steps, features)
    return _result(obs, steps, coef, features, offset=steps - y)


def _check_measurements(obs: list[Observation]) -> None:
    if not obs:
        raise FitError("no measurements to fit")
    bad = [o for o in obs if not math.isfinite(o.seconds) or o.seconds <= 0]
    if bad:
        names = "; ".join(f"{o.label}: {o.seconds!r} s" for o in bad[:5])
        raise FitError(f"{len(bad)} shape(s) have no usable time ({names}); the executor "
                       "returned a zero, negative or non-finite elapsed_s for them")


def own_coefficients(observations: Sequence[Observation],
                     features: Sequence[str] = FEATURES) -> dict[str, tuple[str, ...]]:
    """Per class (``Observation.group``), the features only its shapes exercise: their
    coefficients rest on that class's shapes alone (``swap``'s two, on the grid)."""
    x = np.array([[o.shape.vector()[FEATURES.index(f)] for f in features]
                  for o in observations], dtype=float).reshape(len(observations), -1)
    groups = np.array([o.group for o in observations])
    out: dict[str, tuple[str, ...]] = {}
    for group in dict.fromkeys(o.group for o in observations):
        inside = groups == group
        out[group] = tuple(f for j, f in enumerate(features)
                           if np.any(x[inside, j] != 0) and not np.any(x[~inside, j] != 0))
    return out


def check_determined(observations: Sequence[Observation],
                     features: Sequence[str] = FEATURES) -> None:
    """Refuse measurements too few to determine their coefficients: fewer shapes than
    the coefficients they exercise, or a class with fewer shapes than the coefficients
    only it exercises. Fitted anyway, such shapes are met exactly by any number of
    coefficient sets, and their error reads 0 % whatever the times were."""
    obs = list(observations)
    used = [f for f in features
            if any(o.shape.vector()[FEATURES.index(f)] != 0 for o in obs)]
    counts = {g: sum(o.group == g for o in obs) for g in dict.fromkeys(o.group for o in obs)}
    short = [f"'{g}': {counts[g]} shape(s) for its {len(own)} own coefficients "
             f"({', '.join(own)})" for g, own in own_coefficients(obs, features).items()
             if counts[g] < len(own)]
    if len(obs) >= len(used) and not short:
        return
    overall = (f"the recording's {len(obs)} shape(s) cannot determine the {len(used)} "
               "coefficients they exercise" if len(obs) < len(used) else
               "a class's shapes cannot determine the coefficients only it exercises")
    raise FitError(f"{overall} ({'; '.join(short) or 'no class alone'}): fitted, they "
                   "would be met exactly, at 0 % error, whatever their times; time the "
                   "whole grid (`slopilot calibrate` without editing its samples) and "
                   "fit that")


def exactly_determined(fit: FitResult, features: Sequence[str] = FEATURES
                       ) -> dict[str, tuple[str, ...]]:
    """The classes whose shapes are as many as the coefficients only they exercise:
    their error is 0 by construction, whatever they measured (``swap`` on the quick
    grid: 2 shapes, ``swap_batches`` and ``swap_blocks``)."""
    counts = {g: c.shapes for g, c in fit.classes.items()}
    return {g: own for g, own in own_coefficients(fit.observations, features).items()
            if own and counts.get(g) == len(own)}


ROBUST_SCALE = 0.05  # relative error beyond which a residual counts linearly


def _solve(obs: list[Observation], y: np.ndarray, weights: np.ndarray,
           features: Sequence[str]) -> dict[str, float]:
    index = [FEATURES.index(f) for f in features]
    x = np.array([[o.shape.vector()[i] for i in index] for o in obs], dtype=float)
    try:
        solution = solve_columns(x, y, weights)
    except NotConverged as exc:
        _not_converged(obs, exc.residuals, exc.message)
    return {f: float(v) for f, v in zip(features, solution, strict=True)}


class NotConverged(Exception):
    def __init__(self, message: str, residuals: np.ndarray) -> None:
        super().__init__(message)
        self.message, self.residuals = message, residuals


def solve_columns(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Non-negative coefficients for the columns of ``x`` (rows: observations) that
    minimise the weighted residuals of ``y`` (the module docstring's fit); 0 for a column
    the data never exercises. Raises FitError if no column is exercised, NotConverged
    (with the residuals) if a solver fails."""
    from scipy.optimize import least_squares, lsq_linear

    used = np.flatnonzero(np.any(x != 0, axis=0))
    if used.size == 0:
        raise FitError("every measured shape has all-zero features; nothing to fit")
    a = x[:, used] * weights[:, None]
    scale = np.max(np.abs(a), axis=0)
    a, b = a / scale, y * weights
    res = lsq_linear(a, b, bounds=(0.0, np.inf), method="bvls")
    if not res.success or not np.all(np.isfinite(res.x)):
        raise NotConverged(str(res.message), a @ np.nan_to_num(res.x) - b)
    robust = least_squares(lambda c: a @ c - b, np.maximum(res.x, 0.0), jac=lambda c: a,
                           bounds=(0.0, np.inf), loss="soft_l1", f_scale=ROBUST_SCALE,
                           method="trf")
    if not robust.success or not np.all(np.isfinite(robust.x)):
        raise NotConverged(str(robust.message), a @ res.x - b)
    coef = np.zeros(x.shape[1])
    coef[used] = np.maximum(0.0, robust.x / scale)  # bvls may return -1e-19
    return coef


def _not_converged(obs: list[Observation], residuals: np.ndarray, message: str) -> NoReturn:
    worst = np.argsort(-np.abs(residuals))[:5]
    names = "; ".join(obs[i].label for i in worst)
    raise FitError(f"the least-squares fit did not converge ({message}); the shapes "
                   f"furthest from any fit: {names}")


def _result(obs: list[Observation], measured: np.ndarray, coef: dict[str, float],
            features: Sequence[str], offset: np.ndarray | None = None) -> FitResult:
    index = [FEATURES.index(f) for f in features]
    c = np.array([coef[f] for f in features])
    x = np.array([[o.shape.vector()[i] for i in index] for o in obs], dtype=float)
    predicted = x @ c + (offset if offset is not None else 0.0)
    errors = (predicted - measured) / measured
    classes: dict[str, ClassFit] = {}
    for group in dict.fromkeys(o.group for o in obs):
        idx = [i for i, o in enumerate(obs) if o.group == group]
        err = np.abs(errors[idx])
        worst = idx[int(np.argmax(err))]
        classes[group] = ClassFit(len(idx), float(err.mean()), float(err.max()),
                                  obs[worst].label)
    return FitResult(coef, tuple(float(p) for p in predicted),
                     tuple(float(e) for e in errors), tuple(obs), classes)
