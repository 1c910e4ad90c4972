"""How ``slopilot simulate`` shows requests turned away for load (a full waiting queue):
a TTFT percentile that falls among them is a floor (the histogram's top edge, as the
live rules read it), not a time measured, and the table, its footnotes and the JSON say
so, apart from the requests rejected as too long."""

from __future__ import annotations

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.stats import REFUSED_TTFT_S
from slopilot.engine.sim.summary_view import COLUMNS, footer, rows, simulate_json
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.window_summary import WindowSummary

SCENARIO = load_scenario("tiny-cpu")
REFUSED_MS = REFUSED_TTFT_S * 1000.0


@pytest.fixture(scope="module")
def overloaded() -> WindowSummary:
    """40 P1 requests at once on 4 sequences and 4 waiting places (32 refused for load),
    and one P1 prompt no replica can hold (rejected as too long, not for load)."""
    burst = [TraceRecord(i * 1e-3, 64, 400, Priority.P1) for i in range(40)]
    too_long = [TraceRecord(0.5, 10**6, 4, Priority.P1)]
    run = simulate(SCENARIO, {"max_num_seqs": 4, "max_waiting": 4}, duration_s=2.0,
                   workload=TraceWorkload(burst + too_long, classes=None))
    return run.summary


def _cell(summary: WindowSummary, label: str, column: str) -> str:
    row = next(r for r in rows(summary, SCENARIO.slo) if r[0] == label)
    return row[COLUMNS.index(column)]


def test_a_ttft_p99_among_refused_requests_reads_as_a_floor_not_a_time(
        overloaded: WindowSummary) -> None:
    p1 = overloaded.classes[Priority.P1]
    assert p1.ttft_p99_ms == REFUSED_MS  # what the tuner and the alerts judge: unchanged
    assert _cell(overloaded, "p1", "TTFT p99") == f"≥{REFUSED_TTFT_S:.0f} s"
    assert _cell(overloaded, "all", "TTFT p99") == f"≥{REFUSED_TTFT_S:.0f} s"
    # The mean is of the measured requests: a time, never the floor.
    assert not _cell(overloaded, "p1", "TTFT mean").startswith("≥")


def test_the_footnotes_give_the_refused_share_apart_from_too_long_rejections(
        overloaded: WindowSummary) -> None:
    a = overloaded.classes[Priority.P1].accounting
    assert a is not None and a.requests_arrived == 41 and a.requests_rejected == 33
    lines = footer(overloaded, definitions=False)
    refused = [line for line in lines if "refused for load" in line]
    too_long = [line for line in lines if "too long" in line]
    assert len(refused) == 1 and len(too_long) == 1
    assert "32 request(s) refused for load" in refused[0]
    assert "78%" in refused[0]  # 32 of the 41 that arrived
    assert f"≥{REFUSED_TTFT_S:.0f} s" in refused[0] and "mean" in refused[0]
    assert "1 request(s) rejected as too long" in too_long[0]
    assert "waiting queue" not in too_long[0]


def test_the_json_says_which_ttft_percentiles_fall_among_refused_requests(
        overloaded: WindowSummary) -> None:
    out = simulate_json(overloaded, SCENARIO.slo)
    for figures in (out, out["classes"]["p1"]):
        share = figures["ttft_measured_pct"]
        assert 0.0 < share < 50.0  # 8 measured of 40 ranked
        for q in (50, 90, 99):
            assert (figures[f"ttft_p{q}_ms"] == REFUSED_MS) == (q > share)
    assert out["classes"]["p1"]["requests_refused"] == 32
    assert out["classes"]["p0"]["ttft_measured_pct"] is None  # no P0 traffic at all


def test_without_refusals_every_ttft_percentile_is_measured() -> None:
    records = [TraceRecord(i * 0.1, 64, 8, Priority.P1) for i in range(5)]
    summary = simulate(SCENARIO, duration_s=2.0,
                       workload=TraceWorkload(records, classes=None)).summary
    assert simulate_json(summary, SCENARIO.slo)["ttft_measured_pct"] == 100.0
    assert not _cell(summary, "p1", "TTFT p99").startswith("≥")
    assert not [line for line in footer(summary, definitions=False) if "refused" in line]
