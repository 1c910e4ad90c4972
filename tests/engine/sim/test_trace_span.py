"""A stray time in a trace (a missing value logged as 0 among epoch seconds) is refused
with its line and the window that leaves it out, not replayed as decades of nothing;
quiet nights and multi-day traces still load."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slopilot.engine.sim.scenario import ScenarioError, load_scenario
from slopilot.engine.sim.trace import TraceError, TraceRecord, load_trace, read_trace
from slopilot.engine.sim.trace_scenario import TraceOptions, with_trace
from slopilot.engine.sim.trace_span import stray_gap
from slopilot.engine.sim.workload_spec import TraceSpec

EPOCH = 1_700_000_000.0


def _epoch_rows(n: int = 100, gap: float = 0.5) -> list[str]:
    return [f"{EPOCH + i * gap:.3f},200,50" for i in range(n)]


def _csv(tmp_path: Path, rows: list[str], name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def _spec(path: Path, **kw: object) -> TraceSpec:
    return TraceSpec(trace=str(path), **kw)  # type: ignore[arg-type]


def test_a_zero_among_epoch_seconds_is_refused_naming_its_line_and_the_window(
        tmp_path: Path) -> None:
    rows = _epoch_rows()
    rows.insert(40, "0,200,50")  # line 42: the header, then 40 rows before it
    path = _csv(tmp_path, rows)
    with pytest.raises(TraceError) as e:
        _spec(path).records()
    said = str(e.value)
    assert f"{path}:42:" in said
    assert "1,700,000,000 s" in said and "years" in said  # the gap, in words too
    assert "49.5 s" in said  # what the other arrivals span
    assert "Drop the row" in said and "--trace-window 1700000000:" in said


def test_the_window_it_names_replays_the_rest(tmp_path: Path) -> None:
    rows = ["0,200,50", *_epoch_rows()]
    path = _csv(tmp_path, rows)
    picked = _spec(path, start_s=EPOCH).records()
    assert len(picked) == 100 and picked[0].arrival_time == 0.0
    assert picked[-1].arrival_time == pytest.approx(49.5)


def test_a_stray_time_after_the_rest_is_refused_too(tmp_path: Path) -> None:
    rows = [f"{i * 0.5:g},200,50" for i in range(100)] + ["90000000000,200,50"]
    path = _csv(tmp_path, rows)
    with pytest.raises(TraceError, match=rf"{path.name}:102: this arrival .* or more from "
                                         r"the other 100 arrivals.*--trace-window 0:50\b"):
        _spec(path).records()


def test_with_trace_refuses_it_as_the_cli_says_it(tmp_path: Path) -> None:
    path = _csv(tmp_path, ["0,200,50", *_epoch_rows()])
    with pytest.raises(ScenarioError, match=r"--trace: .*t\.csv:2: .*--trace-window"):
        with_trace(load_scenario("azure-conv-2023"), TraceOptions(path=str(path)))


def test_several_stray_rows_are_named_together(tmp_path: Path) -> None:
    rows = ["0,200,50", "1,200,50", "2,200,50", *_epoch_rows()]
    path = _csv(tmp_path, rows)
    with pytest.raises(TraceError, match=r"t\.csv:2: lines 2, 3, 4 \(3 arrivals"):
        _spec(path).records()


def test_a_jsonl_session_trace_names_the_line_as_written(tmp_path: Path) -> None:
    # Sessions are put in arrival order while read; the line is still the file's.
    rows = [{"arrival_time": EPOCH + i, "prompt_tokens": 10 + i, "output_tokens": 5,
             "session_id": i % 3} for i in range(30)]
    rows.insert(7, {"arrival_time": 0, "prompt_tokens": 10, "output_tokens": 5,
                    "session_id": 1})
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=r"s\.jsonl:8: "):
        _spec(path).records()


def test_mooncake_names_its_line(tmp_path: Path) -> None:
    rows = [{"timestamp": i * 1000, "input_length": 600, "output_length": 5,
             "hash_ids": [i, i + 1]} for i in range(20)]
    rows.append({"timestamp": 4e13, "input_length": 600, "output_length": 5})
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceError, match=r"m\.jsonl:21: "):
        _spec(path).records()


def test_the_lengths_of_such_a_trace_are_still_read(tmp_path: Path) -> None:
    # Its lengths (an empirical distribution, read_trace) do not depend on its times.
    path = _csv(tmp_path, ["0,200,50", *_epoch_rows()])
    assert len(read_trace(path)) == 101
    assert load_trace(path).stray is not None


def test_quiet_nights_and_a_multi_day_trace_load(tmp_path: Path) -> None:
    # BurstGPT-like: 5 days, 8 busy hours a day, 16 quiet ones between.
    rows = [f"{day * 86400 + 9 * 3600 + k * 60:.0f},200,50"
            for day in range(5) for k in range(8 * 60)]
    assert len(_spec(_csv(tmp_path, rows, "days.csv")).records()) == 5 * 480
    # Two captures three weeks apart, each a day long: a long pause, not a stray row.
    rows = [f"{k * 600:.0f},200,50" for k in range(145)] + [
        f"{21 * 86400 + k * 600:.0f},200,50" for k in range(145)]
    assert len(_spec(_csv(tmp_path, rows, "weeks.csv")).records()) == 290


def test_the_shipped_trace_has_no_stray_time() -> None:
    trace = load_trace("azure-llm-2023-conv")
    assert trace.stray is None


@pytest.mark.parametrize("at", [1, 65_535, 65_536, 65_537, 69_999])
def test_the_gap_is_found_wherever_it_lies_in_a_long_trace(at: int) -> None:
    # Gaps are taken a slice of 65,536 at a time: one before, at, across or past an edge.
    records = [TraceRecord(i + (1e9 if i >= at else 0.0), 5, 5) for i in range(70_000)]
    found = stray_gap(records, list(range(2, 70_002)), "t.csv")
    assert found is not None and found.afters == (at - 1,)
    if at in (1, 69_999):  # a side of one row is the stray one
        assert found.message.startswith(f"t.csv:{2 if at == 1 else at + 2}: this arrival")
    else:  # thousands on each side: neither is called stray
        assert "split the trace into 2 parts" in found.message
    assert stray_gap([TraceRecord(EPOCH + i, 5, 5) for i in range(70_000)],
                     list(range(2, 70_002)), "t.csv") is None


def _suggested(message: str) -> list[TraceSpec]:
    """Each ``--trace-window A:B`` a refusal offers, as the spec it makes."""
    out = []
    for start, end in re.findall(r"--trace-window (\d+):(\d*)", message):
        out.append((float(start), float(end) if end else None))
    return out  # type: ignore[return-value]


def test_a_stray_time_on_either_side_is_found_and_the_window_named_holds_neither(
        tmp_path: Path) -> None:
    # The reviewer's file: 0 first, a far future time last; the widest gap alone named a
    # window that still held the 0 and replayed 54 years without a word.
    rows = ["0,200,50", *_epoch_rows(), "9900000000,200,50"]
    path = _csv(tmp_path, rows)
    with pytest.raises(TraceError) as e:
        _spec(path).records()
    said = str(e.value)
    assert f"{path}:2: lines 2, 103 (2 arrivals)" in said
    assert "the other 100 arrivals, which span 49.5 s" in said
    [(start, end)] = _suggested(said)
    picked = _spec(path, start_s=start, end_s=end).records()
    assert len(picked) == 100 and picked[-1].arrival_time == pytest.approx(49.5)


def test_the_span_said_is_the_other_arrivals_own(tmp_path: Path) -> None:
    # Three stray rows spanning 2 s: the rest spans 49.5 s, not 51.5.
    rows = ["0,200,50", "1,200,50", "2,200,50", *_epoch_rows()]
    with pytest.raises(TraceError, match=r"other 100 arrivals, which span 49\.5 s:"):
        _spec(_csv(tmp_path, rows)).records()


def test_two_big_parts_are_each_offered_and_neither_called_stray(tmp_path: Path) -> None:
    # 700 rows logged at 0 and 600 real ones: the count cannot say which is the trace.
    rows = ["0,200,50"] * 700 + _epoch_rows(600)
    path = _csv(tmp_path, rows)
    with pytest.raises(TraceError) as e:
        _spec(path).records()
    said = str(e.value)
    assert "split the trace into 2 parts" in said and "stray time" not in said
    assert "700 arrivals from line 2" in said and "600 arrivals from line 702" in said
    counts = sorted(len(_spec(path, start_s=a, end_s=b).records())
                    for a, b in _suggested(said))
    assert counts == [600, 700]


def test_decades_of_gaps_are_said_to_be_no_seconds(tmp_path: Path) -> None:
    # Every gap weeks long (row numbers times 1.5e6): judged at once, not one by one.
    rows = [f"{i * 1.5e6:.0f},200,50" for i in range(1200)]
    with pytest.raises(TraceError, match=r"1,199 gaps .* are its times seconds"):
        _spec(_csv(tmp_path, rows)).records()
