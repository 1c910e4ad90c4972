"""Open-loop arrival processes: Poisson, gamma (bursty by coefficient of variation), on/off.

Each process is an immutable description that yields arrival times lazily between a start
and an end, so an hour-long high-rate run never holds every timestamp at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

# Inter-arrival gaps are drawn this many at a time: lazy, yet not one numpy call per request.
_CHUNK = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Poisson:
    """Exponential gaps: the memoryless baseline every serving paper uses."""

    rate: float

    def __post_init__(self) -> None:
        _check_rate("rate", self.rate)

    @property
    def mean_rate(self) -> float:
        return self.rate

    def times(self, rng: np.random.Generator, start: float, end: float) -> Iterator[float]:
        return _renewal(_exponential(rng, self.rate), start, end)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gamma:
    """Gamma gaps with mean 1/rate and coefficient of variation ``cv``.

    cv = 1 is Poisson; cv > 1 clusters arrivals into bursts (production traces sit around
    2-4); cv < 1 is smoother than Poisson.
    """

    rate: float
    cv: float

    def __post_init__(self) -> None:
        _check_rate("rate", self.rate)
        if not (math.isfinite(self.cv) and 0.05 <= self.cv <= 20):
            raise ValueError(f"cv={self.cv}: must be in [0.05, 20] (1 is Poisson)")

    @property
    def mean_rate(self) -> float:
        return self.rate

    def times(self, rng: np.random.Generator, start: float, end: float) -> Iterator[float]:
        shape = 1.0 / self.cv**2
        scale = 1.0 / (self.rate * shape)
        return _renewal(lambda n: rng.gamma(shape, scale, n), start, end)


@dataclass(frozen=True, slots=True, kw_only=True)
class OnOff:
    """Poisson at ``rate`` for ``on_s`` seconds, then at ``off_rate`` for ``off_s``, repeating.

    The cycle is deterministic so a test (or an operator watching a dashboard) knows when
    the bursts come; the arrivals inside each period are random.
    """

    rate: float
    on_s: float
    off_s: float
    off_rate: float = 0.0

    def __post_init__(self) -> None:
        _check_rate("rate", self.rate)
        if not (math.isfinite(self.off_rate) and self.off_rate >= 0):
            raise ValueError(f"off_rate={self.off_rate}: must be a finite number >= 0")
        for name, value in (("on_s", self.on_s), ("off_s", self.off_s)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}: must be a positive number of seconds")

    @property
    def mean_rate(self) -> float:
        return (self.rate * self.on_s + self.off_rate * self.off_s) / (self.on_s + self.off_s)

    def times(self, rng: np.random.Generator, start: float, end: float) -> Iterator[float]:
        period = self.on_s + self.off_s
        cycle = 0
        while True:
            on_start = start + cycle * period
            windows = ((on_start, on_start + self.on_s, self.rate),
                       (on_start + self.on_s, on_start + period, self.off_rate))
            for lo, hi, rate in windows:
                if lo >= end:
                    return
                # Memorylessness lets each window start its own exponential clock.
                if rate > 0:
                    yield from _renewal(_exponential(rng, rate), lo, min(hi, end))
            cycle += 1


ArrivalProcess = Poisson | Gamma | OnOff


def _exponential(rng: np.random.Generator, rate: float) -> Callable[[int], np.ndarray]:
    return lambda n: rng.exponential(1.0 / rate, n)


def _renewal(gaps: Callable[[int], np.ndarray], start: float, end: float) -> Iterator[float]:
    """Cumulative sums of gap chunks from ``start`` until ``end`` (exclusive)."""
    t = start
    while True:
        chunk = t + np.cumsum(gaps(_CHUNK))
        for value in chunk:
            if value >= end:
                return
            yield float(value)
        t = float(chunk[-1])


def _check_rate(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value}: must be a positive number of requests per second")
