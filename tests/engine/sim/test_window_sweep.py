"""``worst_starts``: the window from an arrival with the highest TTFT P99 of a class."""

from __future__ import annotations

from slopilot.engine.request import Priority
from slopilot.engine.sim.window_stats import FirstToken
from slopilot.engine.sim.window_sweep import ttft_p99s, worst_starts


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
