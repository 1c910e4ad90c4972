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
    # Counted as they come: a token costs no memory, a request 16 bytes.
    gaps = _gaps(range(0), over=0, gaps=10_000)
    assert len(gaps) == 100
    arrivals, counts, over = gaps.series(Priority.P1)
    assert counts.tolist() == [10_000] * 100 and not over.any()
    assert arrivals.tolist() == [float(t) for t in range(100)]
