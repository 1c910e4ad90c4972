"""The arrivals' burstiness, a gamma cv from the dispersion of 15 s bin counts: a bursty
load (gamma gaps, cv 4) planned as Poisson read as calm, and the loop scaled 6 -> 3."""

from __future__ import annotations

import numpy as np
import pytest

from slopilot.engine.sim.arrivals import ArrivalProcess, Gamma, Poisson
from slopilot.tuner.prometheus.burstiness import (
    MIN_BINS,
    Burstiness,
    arrival_process,
    counter_bins,
    from_times,
)

END = 1200.0


def _times(process: ArrivalProcess, seed: int) -> list[float]:
    return list(process.times(np.random.default_rng(seed), 0.0, END))


def _window(times: list[float], window_s: float) -> list[float]:
    return [t for t in times if END - window_s <= t < END]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_poisson_load_reads_cv_about_one_and_is_planned_as_poisson(seed: int) -> None:
    b = from_times(_window(_times(Poisson(rate=4.0), seed), 300), END - 300, END)
    assert b.bins == 20 and b.cv is not None and 1.0 <= b.cv < 1.3
    assert not b.bursty


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_gamma_cv_4_load_reads_cv_3_to_5(seed: int) -> None:
    b = from_times(_window(_times(Gamma(rate=4.0, cv=4.0), seed), 300), END - 300, END)
    assert b.cv is not None and 2.5 <= b.cv <= 5.5 and b.bursty


def test_fewer_than_eight_complete_bins_is_no_verdict() -> None:
    times = _times(Gamma(rate=4.0, cv=4.0), 0)
    short = from_times(_window(times, 105), END - 105, END)  # 7 bins of 15 s
    assert short.cv is None and short.bins == MIN_BINS - 1
    assert short.why_none is not None and "only 7 complete bins" in short.why_none
    assert from_times(_window(times, 120), END - 120, END).bins == MIN_BINS


def _counters(by_replica: list[list[float]], start: float, *, spacing: float = 15.0,
              before: float = 1000.0, phase: float = 3.0) -> list[list[tuple[float, float]]]:
    """Each replica's raw counter samples over ``(start, END]``, scraped every
    ``spacing``: the arrivals up to each scrape, ``before`` counted earlier."""
    scrapes = np.arange(start + phase, END + 1e-9, spacing)
    return [[(float(t), before + float(np.sum(np.asarray(ts) <= t))) for t in scrapes]
            for ts in by_replica]


def _split(times: list[float], replicas: int, seed: int) -> list[list[float]]:
    who = np.random.default_rng(seed).integers(0, replicas, len(times))
    return [[t for t, r in zip(times, who, strict=True) if r == i] for i in range(replicas)]


def test_raw_counter_samples_read_as_the_arrival_times_do() -> None:
    times = _window(_times(Gamma(rate=4.0, cv=4.0), 1), 300)
    start = END - 300
    b = counter_bins(_counters(_split(times, 3, 0), start, phase=0.0), start, END)
    direct = from_times(times, start, END)
    # Scrapes on the bins' edges would put each in one bin or the next by their jitter:
    # the bins are moved half a scrape back, one fewer fits.
    assert b.bins == 19 and b.cv is not None and direct.cv is not None
    assert b.cv == pytest.approx(direct.cv, abs=0.4) and b.bursty


def test_a_counter_reset_reads_as_no_reset() -> None:
    start = END - 300
    series = _counters(_split(_window(_times(Gamma(rate=4.0, cv=4.0), 2), 300), 3, 0),
                       start)
    reset = [list(s) for s in series]
    # Replica 1 restarted half-way: its counter counts from zero after.
    k = len(reset[1]) // 2
    base = reset[1][k - 1][1]
    reset[1] = reset[1][:k] + [(t, v - base) for t, v in reset[1][k:]]
    assert counter_bins(reset, start, END) == counter_bins(series, start, END)


def test_a_replica_that_appears_mid_window_counts_from_zero() -> None:
    """Scaled up at 1050 s: its first scrape holds the arrivals since it started. Left
    out (``increase()`` without its extrapolation), that bin read low, as a burst's
    trough; taken whole, a replica whose early scrapes failed added its lifetime."""
    start = END - 300
    times = _window(_times(Poisson(rate=4.0), 3), 300)
    old = [t for t in times if t < 1050.0]
    new = [t for t in times if t >= 1050.0]
    one = _counters([times], start)
    late = _counters([old, new], start, before=0.0)
    late[1] = [(t, v) for t, v in late[1] if t > 1050.0]
    late[0] = [(t, v + 1000.0) for t, v in late[0]]
    assert counter_bins(late, start, END) == counter_bins(one, start, END)
    # An old series whose first scrapes in the window failed starts at its first value.
    gap = _counters([times], start)
    gap[0] = gap[0][4:]
    assert counter_bins(gap, start, END).cv == pytest.approx(
        counter_bins(one, start, END).cv, abs=0.3)


def test_bins_are_never_narrower_than_the_scrapes() -> None:
    times = _window(_times(Gamma(rate=4.0, cv=4.0), 4), 600)
    sixty = counter_bins(_counters([times], END - 300, spacing=60.0), END - 300, END)
    assert sixty.cv is None and sixty.bin_s == 60.0  # 5 bins of 60 s: no verdict
    long = counter_bins(_counters([times], END - 600, spacing=60.0), END - 600, END)
    assert long.bin_s == 60.0 and long.bins >= MIN_BINS and long.cv is not None


def test_the_twins_arrivals() -> None:
    assert arrival_process(2.0, Burstiness(3.5, 20), None) == Gamma(rate=2.0, cv=3.5)
    assert arrival_process(2.0, Burstiness(1.1, 20), Gamma(rate=9, cv=3)) == Poisson(rate=2.0)
    unmeasured = Burstiness(None, 3, why_none="only 3 bins")
    assert arrival_process(2.0, unmeasured, Gamma(rate=9, cv=3)) == Gamma(rate=2.0, cv=3)
    assert arrival_process(2.0, None, Poisson(rate=9)) == Poisson(rate=2.0)


def _steady_with_missed_scrapes(seed: int, missed: float, rate: float = 30.0
                                ) -> list[list[tuple[float, float]]]:
    """Six replicas sharing a Poisson load, scraped every 15 s (each its own phase), a
    share ``missed`` of the scrapes failing (a replica too busy to answer in time)."""
    rng = np.random.default_rng(seed)
    times = _times(Poisson(rate=rate), seed)
    who = rng.integers(0, 6, len(times))
    out = []
    for r in range(6):
        mine = np.sort(np.asarray(times)[who == r])
        scrapes = np.arange(rng.uniform(0, 15.0), END, 15.0)
        scrapes = scrapes[(scrapes > END - 600) & (rng.uniform(size=len(scrapes)) >= missed)]
        out.append([(float(t), float(np.searchsorted(mine, t))) for t in scrapes])
    return out


@pytest.mark.parametrize("missed", [0.02, 0.1])
def test_missed_scrapes_read_no_bursts(missed: float) -> None:
    """Reviewer's repro: the increase over a missed scrape put whole in the next bin read
    a steady load as cv 2.3 in every probe with 2 % of scrapes failing, 5.1 with 10 %.
    Now as a steady load reads with none missed: bursty by chance in a few probes."""
    read = [counter_bins(_steady_with_missed_scrapes(seed, missed), END - 600, END - 0.37)
            for seed in range(10)]
    assert sum(b.bursty for b in read) <= 2, [b.cv for b in read]
    assert float(np.median([b.cv for b in read])) < 1.2


@pytest.mark.parametrize("jitter_s", [0.002, 0.02])
def test_bins_ending_on_the_scrape_grid_read_no_bursts(jitter_s: float) -> None:
    """Reviewer's repro: bins ending at the newest sample, on Prometheus' scrape grid,
    put each sample in one bin or the next by its jitter: cv 5 in nine probes of ten."""
    read = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        times = np.sort(np.asarray(_times(Poisson(rate=20.0), seed)))
        end = 1_733_500_000.0
        grid = np.arange(END - 600, END + 1e-9, 15.0)
        scrapes = [(end - END + t + rng.normal(0, jitter_s), float(np.searchsorted(times, t)))
                   for t in grid]
        read.append(counter_bins([scrapes], scrapes[0][0], scrapes[-1][0]))
    assert sum(b.bursty for b in read) <= 2, [b.cv for b in read]


@pytest.mark.parametrize("rate", [30.0, 100.0])
def test_a_load_that_halved_at_a_high_rate_reads_no_bursts(rate: float) -> None:
    """Reviewer's repro: as differences, one step read cv 1.7 at 30 req/s and 2.7 at 100
    every time; the window's largest level shift is taken off."""
    bursty = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        times = np.asarray(_times(Poisson(rate=rate), seed))
        halved = (times >= END - 300) | (rng.random(len(times)) < 0.5)
        times = times[(times >= END - 600) & halved]
        bursty += from_times([float(t) for t in times], END - 600, END).bursty
    assert bursty <= 2


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_poisson_load_that_halved_mid_window_reads_no_bursts_of_cv_2(seed: int) -> None:
    """Read as var / mean, the two levels' bins read cv ~2.5 every time, and the scale-down
    that follows a fall in load would have been planned for bursts; as differences of
    successive bins, the step is one difference among nineteen."""
    rng = np.random.default_rng(seed)
    times = np.array(_window(_times(Poisson(rate=8.0), seed), 300))
    early = times < END - 150
    kept = times[~early | (rng.random(len(times)) < 0.5)]
    b = from_times([float(t) for t in kept], END - 300, END)
    assert b.cv is not None and b.cv < 2.0
    counts = np.histogram(kept, bins=np.arange(END - 300, END + 1e-9, 15.0))[0]
    assert np.sqrt(counts.var(ddof=1) / counts.mean()) > 2.0  # the spread's reading
