"""The 429's Retry-After: the backlog over the rate requests get through, clamped."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.engine.server.retry_after import RetryAfter


def through(est: RetryAfter, *times: float) -> None:
    req: Any = None  # the estimator only counts first tokens; it never reads the request
    for t in times:
        est.on_first_token(req, 0.1, t)


def test_no_history_answers_the_unknown_default() -> None:
    assert RetryAfter(unknown_s=5).seconds(waiting=100, now=10.0) == 5


def test_backlog_over_rate() -> None:
    est = RetryAfter(window_s=30.0)
    through(est, *[i * 0.5 for i in range(60)])  # 2 requests/s for 30 s
    assert est.seconds(waiting=20, now=29.5) == 10  # 20 waiting / 2 per s
    assert est.seconds(waiting=1, now=29.5) == 1  # clamped to at least a second
    assert est.seconds(waiting=10_000, now=29.5) == 60  # and at most a minute


def test_only_the_window_counts_and_a_stall_falls_back() -> None:
    est = RetryAfter(window_s=10.0, unknown_s=7)
    through(est, *[float(i) for i in range(10)])  # 1/s until t=9
    assert est.seconds(waiting=4, now=9.5) == 4
    assert est.seconds(waiting=4, now=100.0) == 7  # nothing through for 90 s


def test_a_young_engine_is_not_taken_for_a_fast_one() -> None:
    est = RetryAfter()
    through(est, 0.0, 0.1)  # two requests 0.1 s apart: not 20 per second yet
    assert est.seconds(waiting=10, now=0.1) == 5  # rate over at least 1 s: 2/s


@pytest.mark.parametrize("kwargs", [{"window_s": 0}, {"lo_s": 0}, {"lo_s": 9, "unknown_s": 5},
                                    {"unknown_s": 90}])
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="need window_s > 0"):
        RetryAfter(**kwargs)
