"""loop_truth's client-side arithmetic on made-up streams: percentiles, token gaps, the
per-request SLO rule, and which window counts each event."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from slopilot.engine.histogram_quantiles import latency_quantile
from slopilot.engine.slo import ClassSLO

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import loop_truth as lt

SLO = ClassSLO(ttft_p99_ms=100, tbt_p99_ms=20)


def test_percentile_interpolates_between_ranks_as_numpy() -> None:
    assert math.isnan(lt.percentile([], 0.99))
    assert lt.percentile([5.0], 0.99) == 5.0
    assert lt.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert lt.percentile(list(range(101)), 0.99) == pytest.approx(99.0)
    assert lt.percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    # Past the finite samples (requests never served): infinite, not NaN.
    assert math.isinf(lt.percentile([1.0, math.inf, math.inf], 0.99))
    assert math.isinf(lt.percentile([1.0, 2.0, math.inf], 0.99))
    assert lt.percentile([1.0, 2.0, 3.0, math.inf], 0.5) == 2.5


def test_a_chunk_is_one_gap_whatever_it_brings() -> None:
    rec = lt.Record("p0", SLO, sent=0.0, arrivals=[0.05, 0.06, 0.10], tokens=[2, 1, 2],
                    done=True)
    # The first chunk's wait is the TTFT; the second waited 10 ms, the third 40 ms, one
    # gap each, as a client timing chunks counts them (``ClientGaps``).
    assert lt.token_gaps(rec) == [(0.06, pytest.approx(0.01)), (0.10, pytest.approx(0.04))]
    assert rec.output_tokens == 5


def test_met_is_the_engines_rule_on_the_clients_timings() -> None:
    fast = lt.Record("p0", SLO, 0.0, [0.05 + 0.01 * i for i in range(101)], [1] * 101, True)
    assert lt.met(fast)
    # One slow gap in 100 is 1 %: still met; two are not.
    one = lt.Record("p0", SLO, 0.0, [*fast.arrivals[:50], *(t + 0.03 for t in fast.arrivals[50:])],
                    [1] * 101, True)
    assert lt.met(one)
    two = lt.Record("p0", SLO, 0.0, [*one.arrivals[:80], *(t + 0.03 for t in one.arrivals[80:])],
                    [1] * 101, True)
    assert not lt.met(two)
    late = lt.Record("p0", SLO, 0.0, [0.2, 0.21], [1, 1], True)
    assert not lt.met(late)
    assert lt.met(lt.Record("p2", ClassSLO(), 0.0, [9.0, 19.0], [1, 1], True))


def test_each_event_counts_in_the_window_it_arrived_in() -> None:
    # Sent in window 0, first token in window 0, finished in window 1.
    straddling = lt.Record("p0", SLO, 9.0, [9.05, 10.5], [1, 3], True)
    # Entirely in window 1, missed its TTFT.
    late = lt.Record("p0", SLO, 11.0, [11.5, 11.51], [1, 1], True)
    cut = lt.Record("p0", SLO, 12.0, [12.01], [1], False)  # never finished
    other = lt.Record("p1", SLO, 12.0, [12.01], [1], True)
    recs = [straddling, late, cut, other]
    w0 = lt.client_figures(recs, 0.0, 10.0, "p0")
    assert w0.ttft_p99_ms == pytest.approx(50.0)
    # Read through the engine's buckets: interpolated inside (0.05, 0.075].
    assert w0.ttft_p99_bucketed == pytest.approx(latency_quantile(0.99, [9.05 - 9.0]) * 1000)
    assert math.isnan(w0.tbt_p99_ms) and w0.finished == 0 and w0.throughput == 0
    assert math.isnan(w0.attain_requests)
    w1 = lt.client_figures(recs, 10.0, 20.0, "p0")
    assert w1.finished == 2
    assert w1.throughput == pytest.approx((4 + 2) / 10)
    # Neither met: the straddler waited 1,450 ms for its last three tokens (one chunk,
    # one gap, over 20 ms), the late one's first token came over 100 ms.
    assert w1.goodput == 0.0 and w1.attain_tokens == 0.0 and w1.attain_requests == 0.0
    assert w1.tbt_p99_ms == pytest.approx(lt.percentile([1450.0, 10.0], 0.99))


def test_relative_error() -> None:
    assert lt.relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert lt.relative_error(0.0, 0.0) == 0.0
    assert math.isinf(lt.relative_error(1.0, 0.0))
    assert math.isnan(lt.relative_error(math.nan, 1.0))


def test_a_client_turned_away_is_a_first_token_never_given_and_a_miss() -> None:
    """A 429: the client got nothing. It counts in the window it was sent in, in the TTFT
    P99 as a first token never given (infinite; its bucketed form the last finite edge,
    as the loop's rules read it), and in both attainments as a miss, at the tokens it
    asked for."""
    from slopilot.engine.latency_buckets import LATENCY_BUCKETS

    served = [lt.Record("p0", SLO, float(i), [i + 0.05, i + 0.06], [1, 1], True, asked=2)
              for i in range(9)]
    refused = lt.Record("p0", SLO, 5.5, refused=True, asked=6)
    figures = lt.client_figures([*served, refused], 0.0, 10.0, "p0")
    assert figures.refused == 1.0
    assert math.isinf(figures.ttft_p99_ms)
    assert figures.ttft_p99_bucketed == LATENCY_BUCKETS[-1] * 1000
    assert figures.attain_tokens == pytest.approx(18 / 24)
    assert figures.attain_requests == pytest.approx(9 / 10)
    # Sent before the window: not this window's.
    assert lt.client_figures([*served, refused], 6.0, 10.0, "p0").refused == 0.0
