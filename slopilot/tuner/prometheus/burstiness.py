"""How bursty the arrivals of a window were: a gamma cv from the dispersion of bin counts.

The capacity oracle plans on a scenario built from the last window (the probes); planned
as Poisson, a bursty load (gamma gaps, cv 4) read as calm: the loop scaled 6 -> 3 and six
of the next eight windows breached. For a renewal process the counts of bins that each
hold many gaps have var / mean -> cv^2 (the index of dispersion, D), so ``cv = sqrt(D)``.
D is read from successive bins' differences, ``mean((c[i+1] - c[i])^2) / (2 mean(c))``
(the Allan factor: the same cv^2 for a steady renewal load, Poisson's 1), not from their
spread around the window's mean: a load that stepped to half inside the window read cv
2.5 as var / mean from Poisson arrivals at 8 req/s, and the scale-down that follows a fall
in load would have been planned for bursts. As differences the step is one large
difference, which still read cv 1.7 at 30 req/s and 2.7 at 100: the window's largest
level shift is taken off it (``_without_level_shift``; ``tests/tuner/test_burstiness.py``).

The verdict is clipped to ``[CV_FLOOR, CV_CAP]``: a load smoother than Poisson (D < 1, or
a Poisson load whose eight bins happened to read low) planned as Poisson errs safe (more
variable than the truth: a replica too many, never one too few), while cv past ``CV_CAP``
is more than eight bins can tell apart and would only stretch every capacity run
(``sample_floor.burst_floor``: the floor grows as cv^2). Fewer than ``MIN_BINS`` complete
bins is no verdict: the base scenario's process is kept (``arrival_process``).

Three sources feed it: arrival times (the simulated cluster's), and the raw samples of an
arrivals counter (Prometheus' ``counter[w]``, the demo's direct scrapes), binned by
``counter_bins``. A rate that moved inside the window (a ramp) reads as bursts too: the
plan is then for more than the steady load, the safe side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slopilot.engine.sim.arrivals import ArrivalProcess, Gamma, Poisson
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.workload_spec import OpenLoopSpec

BIN_S = 15.0
"""The bins' width where the samples allow it: at a few requests a second, 15 s hold tens
of gaps, as the estimate needs; the probes' 120 s window holds the ``MIN_BINS``."""
BURST_WINDOW_S = 600.0
"""How far back the probes read the arrivals' burstiness (at least their own window): 8
bins of 15 s fit in 120 s only where a sample falls on its first second, and scrapes of
60 s need 9 minutes for 8. Read as differences, a load that moved over the 10 minutes
does not read as bursts (module docstring)."""
MIN_BINS = 8
"""Fewer complete bins: the sample variance of a heavy-tailed count swings too far."""
CV_FLOOR = 1.0
CV_CAP = 6.0
GAMMA_ABOVE = 1.2
"""A measured cv at or below this is planned as Poisson, however many bins: a load that
little burstier than Poisson is within the twin's other errors."""
POISSON_QUANTILE = 0.975
"""And a cv is planned as gamma only where a Poisson load's bins would read one that high
less often than about 1 - this: the dispersion of n Poisson bins is near chi-square with
n - 1 degrees of freedom over n - 1 (as differences, the adjacent ones correlated, a
little wider: 3.5 % of 200 seeds read above it), and eight bins of a steady load read
cv > 1.2 in one probe in five, which would have planned a smooth load as bursty
(``burst_threshold``: 1.51 at 8 bins, 1.31 at 20, towards ``GAMMA_ABOVE`` with more)."""

Samples = Sequence[tuple[float, float]]
"""One counter series' raw ``(time, value)`` samples, in time order."""


@dataclass(frozen=True, slots=True)
class Burstiness:
    """The arrivals' burstiness over one window: ``cv`` None where it was not measured
    (``why_none`` says why: too few bins, no arrivals, no counter)."""

    cv: float | None
    bins: int = 0
    bin_s: float = BIN_S
    why_none: str | None = None

    @property
    def bursty(self) -> bool:
        """Whether the twin plans gamma arrivals on it (``burst_threshold``)."""
        return self.cv is not None and self.cv > burst_threshold(self.bins)

    def describe(self) -> str:
        if self.cv is None:
            return f"burstiness not measured ({self.why_none}): the base's arrivals kept"
        return f"arrival cv {self.cv:.2f} over {self.bins} bins of {self.bin_s:g} s"


def burst_threshold(bins: int) -> float:
    """The cv above which ``bins`` bins read a bursty load, not a Poisson one's chance."""
    from scipy.stats import chi2

    dof = max(1, bins - 1)
    return max(GAMMA_ABOVE, math.sqrt(float(chi2.ppf(POISSON_QUANTILE, dof)) / dof))


def unmeasured(why: str) -> Burstiness:
    return Burstiness(cv=None, why_none=why)


def from_counts(counts: Sequence[float], bin_s: float) -> Burstiness:
    """The verdict on complete bins' arrival counts (every replica's, summed)."""
    n = len(counts)
    if n < MIN_BINS:
        return Burstiness(None, n, bin_s, f"only {n} complete bins of {bin_s:g} s in the "
                                          f"window; {MIN_BINS} needed (widen the window)")
    values = np.asarray(counts, dtype=float)
    mean = float(values.mean())
    if not mean > 0:
        return Burstiness(None, n, bin_s, "no arrivals in the window")
    dispersion = float(np.mean(_without_level_shift(values) ** 2)) / (2.0 * mean)
    cv = min(CV_CAP, max(CV_FLOOR, math.sqrt(max(dispersion, 0.0))))
    return Burstiness(cv, n, bin_s)


def _without_level_shift(values: np.ndarray) -> np.ndarray:
    """Successive differences, the window's largest level shift taken off the one it falls
    on: the split of the bins whose two means differ most for their sizes (the CUSUM
    change point). A load that fell by half inside the window is one step, not bursts (at
    30 req/s its difference alone read cv 1.7 every time, at 100 req/s 2.7); a bursty
    load's best split moves its means little, and one of its many differences by that."""
    n = len(values)
    sums = np.cumsum(values)[:-1]
    k = np.arange(1, n, dtype=float)
    left, right = sums / k, (float(values.sum()) - sums) / (n - k)
    j = int(np.argmax(k * (n - k) / n * (right - left) ** 2))
    steps = np.diff(values)
    # Only where it shrinks that difference: a ramp's means differ as much, spread over
    # every difference, and taking it off one made that one a burst.
    steps[j] = min(steps[j], steps[j] - (right[j] - left[j]), key=abs)
    return steps


def from_times(times: Sequence[float], start: float, end: float, *,
               bin_s: float = BIN_S) -> Burstiness:
    """The verdict on arrival times in ``[start, end)``, in bins ending at ``end``."""
    n = int((end - start) / bin_s + 1e-9)
    if n < 1:
        return from_counts([], bin_s)
    edges = end - bin_s * np.arange(n, -1, -1, dtype=float)
    counts, _ = np.histogram(np.asarray(times, dtype=float), bins=edges)
    return from_counts([float(c) for c in counts], bin_s)


def counter_bins(series: Sequence[Samples], start: float, end: float, *,
                 min_bin_s: float = BIN_S, minus: Sequence[Samples] = ()) -> Burstiness:
    """The verdict on the raw samples of an arrivals counter over ``(start, end]``, one
    sequence per series (replica and class), their increases summed per bin.

    Bins are ``min_bin_s`` wide, or the samples' spacing where that is wider (60 s scrapes
    give no 15 s bins); they end at ``end`` (or up to a bin before, half-way between
    scrapes: ``_between_scrapes``) and reach back as far as the earliest sample.
    Each increase between two samples lands in the bin of the later one; one over a gap
    of missed scrapes is shared among the scrapes that would have been (put whole in one
    bin, a scrape a busy replica missed left one bin short and the next one double, and 2 %
    of scrapes failing read a steady load as cv 2.3; 5 %: 3.5). A fall is a restart,
    counted from zero; a series that appears mid-window (a replica scaled up, a class's
    first request) counts from zero where its zero lies in the window, as ``increase()``
    extrapolates (its first value shared alike over the time since, at its slope), else it
    starts at its first value (an old series whose earlier scrapes failed); one that
    vanishes counts until its last sample. ``minus``: counters of requests that were no
    load (the meter's invalid ones, a client's 400s), binned alike and taken off, no bin
    below 0. Never a subquery: ``rate(c[15s])[w:15s]`` resamples on Prometheus' own grid
    and read a steady load's jitter as bursts."""
    rows = [sorted(s) for s in series if len(s) >= 2]
    if not rows:
        return unmeasured("no arrivals counter with two samples in the window")
    spacing = max(float(np.median(np.diff([t for t, _ in r]))) for r in rows)
    bin_s = max(min_bin_s, spacing)
    end = _between_scrapes(rows, end, bin_s, spacing)
    first = min(r[0][0] for r in rows)
    n = int((end - first) / bin_s + 1e-9)
    if n < MIN_BINS:
        return from_counts([0.0] * max(n, 0), bin_s)
    counts = _binned(rows, start, end, n, bin_s, spacing)
    taken = [sorted(s) for s in minus if len(s) >= 2]
    if taken:
        counts = np.maximum(counts - _binned(taken, start, end, n, bin_s, spacing), 0.0)
    return from_counts([float(c) for c in counts], bin_s)


def _between_scrapes(rows: Sequence[Samples], end: float, bin_s: float,
                     spacing: float) -> float:
    """``end``, moved back (less than a bin) so that the bins' edges fall half-way between
    the longest series' scrapes, where bins are as wide as the scrapes' spacing. Edges on
    the scrape grid (bins ending at the newest sample) put each sample in one bin or the
    next by its milliseconds of jitter: a steady load read cv 5 in nine probes of ten."""
    if bin_s > 1.5 * spacing:
        return end
    times = np.asarray([t for t, _ in max(rows, key=len)], dtype=float)
    angle = 2.0 * math.pi * ((times - end) % bin_s) / bin_s
    phase = math.atan2(float(np.sin(angle).mean()), float(np.cos(angle).mean()))
    offset = (phase / (2.0 * math.pi) * bin_s) % bin_s  # the scrapes, after each edge
    return end - ((bin_s / 2.0 - offset) % bin_s)


def _binned(rows: Sequence[Samples], start: float, end: float, n: int, bin_s: float,
            spacing: float) -> np.ndarray:
    """The counters' increases in ``n`` bins of ``bin_s`` ending at ``end`` (``counter_bins``)."""
    counts = np.zeros(n)

    def add(t: float, increase: float) -> None:
        # Times from the window's end, and a tolerance of microseconds: epoch seconds put a
        # sample on a bin's edge (Prometheus' scrape grid) on either side of it by float
        # error, and a steady load read as bursts.
        back = (end - t) / bin_s
        if back < -1e-6 or back >= n - 1e-6:
            return
        # Closed on the right: a sample ends the increase before it.
        counts[n - 1 - max(0, math.floor(back + 1e-6) if back > 1e-6 else 0)] += increase

    def spread(t: float, taken: float, increase: float) -> None:
        # Over the scrapes that would have been between: a missed one's share is where
        # it would have fallen, each whole in its bin as a scrape's increase is.
        m = max(1, round(taken / spacing))
        for k in range(m):
            add(t - k * taken / m, increase / m)

    for row in rows:
        (t0, v0), rest = row[0], row[1:]
        if t0 > start + 1.5 * spacing:
            grown = sum(v if v < pv else v - pv
                        for (_, pv), (_, v) in zip(row, rest, strict=False))
            slope = grown / (rest[-1][0] - t0) if rest[-1][0] > t0 else 0.0
            if slope > 0 and v0 / slope <= t0 - start:
                spread(t0, v0 / slope, v0)
        prev_t, prev = t0, v0
        for t, v in rest:
            spread(t, t - prev_t, v if v < prev else v - prev)
            prev_t, prev = t, v
    return counts


def arrival_process(rate: float, burst: Burstiness | None,
                    base: ArrivalProcess | None) -> ArrivalProcess:
    """The twin's arrivals at ``rate``: gamma at the measured cv where it reads bursty,
    Poisson where it was measured calm; unmeasured, ``base``'s burstiness (its cv where it
    is gamma, else Poisson), as the scenario was designed."""
    if burst is not None and burst.cv is not None:
        return Gamma(rate=rate, cv=burst.cv) if burst.bursty else Poisson(rate=rate)
    if isinstance(base, Gamma):
        return Gamma(rate=rate, cv=base.cv)
    return Poisson(rate=rate)


def arrivals_spec(process: ArrivalProcess) -> dict[str, object]:
    """A scenario file's ``arrivals`` section for ``process`` (Poisson or gamma)."""
    if isinstance(process, Gamma):
        return {"process": "gamma", "rate": round(process.rate, 4),
                "cv": round(process.cv, 3)}
    return {"process": "poisson", "rate": round(process.mean_rate, 4)}


def base_arrivals(scenario: Scenario) -> ArrivalProcess | None:
    """The arrival process ``scenario`` was designed with (its first open-loop phase's);
    None for sessions and traces, whose arrivals are no such process."""
    workload = scenario.workload
    return workload.phases[0].arrivals if isinstance(workload, OpenLoopSpec) else None
