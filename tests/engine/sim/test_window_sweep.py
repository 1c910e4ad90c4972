"""``worst_starts``: the window from an arrival with the highest TTFT P99 of a class;
``worst_gap_starts``: the one whose TBT P99 rank lies deepest among gaps over the limit."""

from __future__ import annotations

import numpy as np

from slopilot.engine.request import Priority, Request, SamplingParams
from slopilot.engine.sim.window_stats import FirstToken, TokenGaps
from slopilot.engine.sim.window_sweep import (
    GapWindow,
    gap_windows,
    ttft_p99s,
    worst_gap_starts,
    worst_starts,
)


def _tokens() -> list[FirstToken]:
    # One P1 arrival a second over 100 s, 10 ms each, but at 20 s and 38 s 1 s each (a
    # 20 s window holds both only from past 18 s to 20 s); and from 60 s one more a
    # second, 20 ms each.
    return [FirstToken(float(t), Priority.P1, 1.0 if t in (20, 38) else 0.01)
            for t in range(100)] + [FirstToken(t + 0.5, Priority.P1, 0.02)
                                    for t in range(60, 100)]


def test_the_worst_window_starts_where_it_holds_both_slow_requests() -> None:
    [worst] = worst_starts(_tokens(), 20.0, 0.0, 100.0)
    assert worst.priority is Priority.P1 and 18.0 < worst.start_s <= 20.0
    assert worst.requests == 20 and worst.ttft_p99_ms > 900.0
    # Every 10 s none holds both: each reads one slow request of 20 (its P99 lower).
    grid = ttft_p99s(_tokens(), Priority.P1, [0.0, 10.0, 20.0, 30.0], 20.0, 100.0)
    assert max(g.ttft_p99_ms for g in grid if g.start_s != 20.0) < worst.ttft_p99_ms
    assert [g.requests for g in grid] == [20, 20, 20, 20]


def test_a_floor_keeps_the_worst_window_with_enough_requests_beside_the_thin_one() -> None:
    out = worst_starts(_tokens(), 20.0, 0.0, 100.0, floor=30)
    assert [w.requests >= 30 for w in out] == [True, False]
    assert out[0].start_s >= 50.0 and out[0].ttft_p99_ms < 25.0
    assert out[1].ttft_p99_ms > 900.0


def _gaps(burst: range, over: int, gaps: int = 1000) -> TokenGaps:
    # One P1 arrival a second over 100 s, each streaming ``gaps`` token gaps of 10 ms;
    # those arriving in ``burst`` have ``over`` of them 200 ms, over the 90 ms limit.
    out = TokenGaps({Priority.P1: 0.09})
    for t in range(100):
        req = Request(f"r{t}", [1], SamplingParams(max_tokens=gaps + 1), arrival_time=t)
        out.first_token(req)
        for i in range(gaps):
            out.gap(req, 0.2 if t in burst and i < over else 0.01)
        out.finished(req)
    return out


def test_the_tbt_sweep_finds_the_burst_the_grid_splits() -> None:
    # 20 requests of 1,000 gaps in each 20 s window; those from 5 s to 24 s have 12 over
    # the limit. A grid window every 10 s holds 15 of them at most: 180 of 20,000 gaps, 0.9 %,
    # its P99 within the limit; the window from 5 s holds all 20: 240, 1.2 %, over it.
    gaps = _gaps(range(5, 25), over=12)
    grid = gap_windows(gaps, Priority.P1, [0.0, 10.0, 20.0], 20.0, 100.0)
    assert [(g.gaps, g.over) for g in grid] == [(20_000, 180), (20_000, 180), (20_000, 60)]
    assert not any(g.could_miss for g in grid)
    [worst] = worst_gap_starts(gaps, 20.0, 0.0, 100.0)
    assert (worst.start_s, worst.requests, worst.gaps, worst.over) == (5.0, 20, 20_000, 240)
    assert worst.depth >= 0 and worst.could_miss
    assert worst_gap_starts(gaps, 20.0, 0.0, 100.0, floor=21) == []


def test_depth_reads_the_p99_against_the_limit_as_numpy_ranks_it() -> None:
    # Gaps of 0.5 and 2.0 about a limit of 1.0: depth 0 or more, numpy's P99 is over it;
    # below -1, it is not; at -1 either (it interpolates between a 0.5 and a 2.0).
    for n in range(1, 420):
        for k in range(n // 50 + 3):
            if k > n:
                continue
            p99 = float(np.percentile([0.5] * (n - k) + [2.0] * k, 99))
            depth = GapWindow(Priority.P1, 0.0, 1, n, k).depth
            assert (p99 > 1.0) if depth >= 0 else (depth == -1 or p99 <= 1.0), (n, k)
            assert GapWindow(Priority.P1, 0.0, 1, n, k).could_miss or p99 <= 1.0, (n, k)


def test_a_request_of_many_gaps_is_one_row() -> None:
    # Counted as they come: a token costs no memory, a request 32 bytes.
    gaps = _gaps(range(0), over=0, gaps=10_000)
    assert len(gaps) == 100
    arrivals, counts, over = gaps.series(Priority.P1)
    assert counts.tolist() == [10_000] * 100 and not over.any()
    assert arrivals.tolist() == [float(t) for t in range(100)]


def _near_limit_gaps(burst_at: dict[int, float]) -> tuple[TokenGaps, dict[int, list[float]]]:
    # One P1 arrival a second over 100 s, each of 1,000 token gaps of 10 ms; those in a
    # burst have 10 of them 200 ms, over the 90 ms limit, and one more of the burst's
    # value (``burst_at``: its first arrival -> that gap) in place of a 10 ms one.
    out, kept = TokenGaps({Priority.P1: 0.09}), {}
    for t in range(100):
        req = Request(f"r{t}", [1], SamplingParams(max_tokens=1001), arrival_time=t)
        out.first_token(req)
        first = next((b for b in burst_at if b <= t < b + 20), None)
        gaps = [0.01] * 1000
        if first is not None:
            gaps[:10] = [0.2] * 10
            gaps[10] = burst_at[first]
        for g in gaps:
            out.gap(req, g)
        out.finished(req)
        kept[t] = gaps
    return out, kept


def test_the_tbt_sweep_finds_the_window_that_misses_within_the_one_rank_band() -> None:
    # Two 20 s windows of 20 bursting requests each hold 200 gaps over the limit of
    # 20,000: numpy's P99 reads rank 19,799.01, between the largest gap under the limit
    # and the smallest over it (depth -1), so the counts alone cannot tell them apart.
    # The one from 5 s holds a 89.9 ms gap: its P99 is 91.1 ms, over the limit; the one
    # from 60 s reads 11.9 ms. The sweep must measure the one that misses.
    gaps, kept = _near_limit_gaps({5: 0.0899, 60: 0.01})
    p99 = {s: float(np.percentile([g for t in range(s, s + 20) for g in kept[t]], 99))
           for s in (5, 60)}
    assert p99[5] > 0.09 >= p99[60], p99  # the premise
    both = gap_windows(gaps, Priority.P1, [5.0, 60.0], 20.0, 100.0)
    assert [(w.depth, w.share) for w in both] == [(-1, 0.01), (-1, 0.01)]
    [worst] = worst_gap_starts(gaps, 20.0, 0.0, 100.0)
    assert worst.start_s == 5.0 and worst.misses, worst
    assert [w.misses for w in both] == [True, False]
    # Neither burst's largest gap near the limit: the deepest window is found, and it
    # holds, said so (no replay is spent on it).
    [calm] = worst_gap_starts(_near_limit_gaps({5: 0.01})[0], 20.0, 0.0, 100.0)
    assert calm.depth == -1 and not calm.misses


def test_every_windows_p99_in_the_band_is_numpys_to_the_bit() -> None:
    # Random requests of 1-40 gaps about the limit, 2,000 arriving in the first 300 s and
    # 300 in the next: every 30 s window's ``misses`` is numpy's P99 of its gaps against
    # the limit, the band's P99 numpy's own value (windows within one block of requests
    # and over many, ``window_sweep.BLOCK``).
    rng = np.random.default_rng(7)
    limit = 0.05
    out, kept = TokenGaps({Priority.P1: limit}), []
    arrivals = np.sort(np.concatenate((rng.uniform(0.0, 300.0, 2_000),
                                       rng.uniform(300.0, 600.0, 300))))
    for k, t in enumerate(arrivals.tolist()):
        req = Request(f"r{k}", [1], SamplingParams(max_tokens=50), arrival_time=t)
        out.first_token(req)
        gaps = rng.choice([0.01, 0.049, 0.05, 0.051, 0.2], size=int(rng.integers(1, 40)),
                          p=[0.97, 0.01, 0.01, 0.005, 0.005]).tolist()
        for g in gaps:
            out.gap(req, g)
        out.finished(req)
        kept.append((t, gaps))
    starts = np.unique(np.concatenate((arrivals, arrivals - 30.0, rng.uniform(0, 600, 50))))
    starts = starts[(starts >= 0.0) & (starts <= 570.0)]
    band = 0
    for w in gap_windows(out, Priority.P1, starts.tolist(), 30.0, 600.0):
        i, j = np.searchsorted(arrivals, [w.start_s, w.start_s + 30.0], side="left")
        gaps = [g for _, gs in kept[i:j] for g in gs]
        if not gaps:
            continue
        p99 = float(np.percentile(gaps, 99))
        assert w.misses == (p99 > limit), (w, p99)
        if w.depth == -1 and w.gaps > 1:
            band += 1
            assert w.p99_s == p99, (w, p99)
    assert band > 20, band  # the band is exercised, not only its edges
