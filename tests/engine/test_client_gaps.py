"""A stream's gaps as its client times them: one a chunk that brings tokens.

``vllm bench serve`` appends one ITL per chunk after the first, the whole time since the
chunk before, and nothing for the tokens a chunk brings with it; vLLM's own
``vllm:inter_token_latency_seconds`` is observed once per engine output of a request
(one per iteration, whatever it brings). A 3 s stall whose backed-up tokens go out in one
chunk of 150 is one 3 s gap, not one and 149 gaps of 0 that pull the P99 back down under
the target.
"""

from __future__ import annotations

import pytest

from slopilot.engine.client_gaps import ClientGaps
from slopilot.engine.histogram_quantiles import histogram_quantile
from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.metric_window import HistogramRecorder
from slopilot.engine.slo import ClassSLO


def test_a_chunks_wait_is_one_gap_whatever_it_brings() -> None:
    gaps = ClientGaps()
    assert gaps.written(2, 1.0) is None  # the first chunk's wait is the TTFT
    assert gaps.written(1, 1.01) == pytest.approx(0.01)
    assert gaps.written(2, 1.07) == pytest.approx(0.06)
    assert gaps.written(0, 1.5) is None  # no token: no gap, and the clock goes on from 1.07
    assert gaps.written(150, 1.08) == pytest.approx(0.01)


def stalled_stream() -> tuple[list[float], int]:
    """The reviewer's stream, as ``ClientGaps`` counts it: a first chunk, 60 one-token
    chunks 10 ms apart, a 3 s event-loop stall whose backed-up 150 tokens go out in one
    chunk, then 20 more 10 ms chunks. The gaps, and the tokens the stream brought."""
    gaps, seen, at, tokens = ClientGaps(), [], 0.0, 0
    for n, wait in [(1, 0.0)] + [(1, 0.01)] * 60 + [(150, 3.0)] + [(1, 0.01)] * 20:
        at += wait
        tokens += n
        if (gap := gaps.written(n, at)) is not None:
            seen.append(gap)
    return seen, tokens


def test_a_stall_that_backs_up_many_tokens_shows_in_the_exported_p99() -> None:
    """One gap a chunk: 81 gaps (not one for each of the 230 tokens after the first), one
    of them 3 s, 1.2 % of them: the P99 read off the exported histogram lies past 1 s.
    Counted one a token (the stall and 149 zeros: 230 gaps), it read 11 ms, under a
    20 ms target the client saw missed."""
    seen, tokens = stalled_stream()
    assert tokens == 231 and len(seen) == 81
    hist = HistogramRecorder(TOKEN_LATENCY_BUCKETS)
    for gap in seen:
        hist.observe(gap)
    assert hist.count == 81
    assert hist.total == pytest.approx(3.0 + 80 * 0.01)
    cumulative = {float(le): c for le, c in hist.cumulative()}
    assert histogram_quantile(0.99, cumulative) > 1.0
    assert not ClassSLO(ttft_p99_ms=100, tbt_p99_ms=20).met(
        0.0, len(seen), sum(1 for g in seen if g > 0.02))


def test_a_stall_that_brings_two_tokens_is_judged_as_the_client_saw_it() -> None:
    """49 one-token chunks 10 ms apart and a 60 ms wait that brings two tokens: 49 gaps,
    one over 40 ms, 2 % of them: missed, as a client timing its chunks counts it."""
    slo = ClassSLO(ttft_p99_ms=400, tbt_p99_ms=40)
    gaps = ClientGaps()
    seen = [g for i, n in enumerate([1] * 49 + [2])
            if (g := gaps.written(n, 0.01 * i if i < 49 else 0.48 + 0.06)) is not None]
    assert len(seen) == 49  # one a chunk after the first
    over = sum(1 for g in seen if g > 0.04)
    assert over == 1
    assert sum(seen) == pytest.approx(0.54)
    assert not slo.met(0.1, len(seen), over)
