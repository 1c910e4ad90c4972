"""Seeded distributions for token lengths, think times and turn counts.

Every distribution is an immutable description; the randomness comes from the numpy
Generator passed in, so one description can drive many seeded runs. Draws are clipped to
``[min, max]``: real length distributions have a floor (a prompt has at least one token)
and a ceiling (the model's context), and a lognormal tail would otherwise run past both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class _Clip:
    min: float = 0.0
    max: float = math.inf

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min) and self.min >= 0):
            raise ValueError(f"min={self.min}: must be a finite number >= 0")
        if not self.max >= self.min:
            raise ValueError(f"max={self.max}: must be at least min={self.min}")

    def _raw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def nominal_mean(self) -> float:
        """Nominal mean before clipping (what the scenario author asked for)."""
        raise NotImplementedError

    def floats(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws as floats (think times, seconds)."""
        return np.clip(self._raw(rng, n), self.min, self.max)

    def ints(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws rounded to whole numbers, at least 1 (token counts, turns)."""
        lo = max(1.0, math.ceil(self.min))
        hi = math.floor(self.max) if math.isfinite(self.max) else np.iinfo(np.int64).max
        return np.clip(np.rint(self._raw(rng, n)), lo, hi).astype(np.int64)

    def float1(self, rng: np.random.Generator) -> float:
        return float(self.floats(rng, 1)[0])

    def int1(self, rng: np.random.Generator) -> int:
        return int(self.ints(rng, 1)[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixed(_Clip):
    value: float = 1.0

    def __post_init__(self) -> None:
        _Clip.__post_init__(self)
        if not (math.isfinite(self.value) and self.value >= 0):
            raise ValueError(f"value={self.value}: must be a finite number >= 0")

    def _raw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))

    @property
    def nominal_mean(self) -> float:
        return float(self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Uniform(_Clip):
    """Uniform on [low, high]; whole-number draws are uniform over the integers in it."""

    low: float = 0.0
    high: float = 1.0

    def __post_init__(self) -> None:
        _Clip.__post_init__(self)
        if not (math.isfinite(self.low) and self.low >= 0):
            raise ValueError(f"low={self.low}: must be a finite number >= 0")
        if not (math.isfinite(self.high) and self.high >= self.low):
            raise ValueError(f"high={self.high}: must be a finite number >= low={self.low}")

    def _raw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, n)

    def ints(self, rng: np.random.Generator, n: int) -> np.ndarray:
        # rint of a continuous uniform gives the end points half weight; draw integers.
        lo, hi = math.ceil(self.low), math.floor(self.high)
        if hi < lo:
            return _Clip.ints(self, rng, n)
        raw = rng.integers(lo, hi + 1, n).astype(np.float64)
        top = math.floor(self.max) if math.isfinite(self.max) else np.iinfo(np.int64).max
        return np.clip(raw, max(1.0, math.ceil(self.min)), top).astype(np.int64)

    @property
    def nominal_mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormal(_Clip):
    """Lognormal with the given arithmetic ``mean``; ``sigma`` is the log-space spread.

    Parameterised by the mean (not the log-mean) because that is the figure traces
    report; mu = ln(mean) - sigma^2 / 2 keeps E[X] = mean.
    """

    mean: float = 1.0
    sigma: float = 0.5

    def __post_init__(self) -> None:
        _Clip.__post_init__(self)
        if not (math.isfinite(self.mean) and self.mean > 0):
            raise ValueError(f"mean={self.mean}: must be a finite number > 0")
        if not (math.isfinite(self.sigma) and 0 <= self.sigma <= 5):
            raise ValueError(f"sigma={self.sigma}: must be in [0, 5]")

    def _raw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2
        return rng.lognormal(mu, self.sigma, n)

    @property
    def nominal_mean(self) -> float:
        return self.mean


@dataclass(frozen=True, slots=True, kw_only=True)
class Empirical(_Clip):
    """Resamples observed values (e.g. a trace's prompt lengths), optionally weighted."""

    values: tuple[float, ...] = (1.0,)
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _Clip.__post_init__(self)
        if not self.values:
            raise ValueError("values is empty: give at least one observed value")
        if not all(math.isfinite(v) and v >= 0 for v in self.values):
            raise ValueError("values: every value must be a finite number >= 0")
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(
                    f"weights has {len(self.weights)} entries but values has "
                    f"{len(self.values)}: give one weight per value")
            if not all(math.isfinite(w) and w >= 0 for w in self.weights) \
                    or sum(self.weights) <= 0:
                raise ValueError("weights: must be finite, >= 0 and not all zero")

    def _probabilities(self) -> np.ndarray | None:
        if self.weights is None:
            return None
        w = np.asarray(self.weights, dtype=np.float64)
        if math.isinf(sum(self.weights)):  # each finite, their sum past a float's range
            w = w / w.max()
        return w / w.sum()

    def _raw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        values = np.asarray(self.values, dtype=np.float64)
        return rng.choice(values, size=n, p=self._probabilities())

    @property
    def nominal_mean(self) -> float:
        p = self._probabilities()
        values = np.asarray(self.values, dtype=np.float64)
        return float(values.mean() if p is None else (values * p).sum())


Distribution = Fixed | Uniform | LogNormal | Empirical
