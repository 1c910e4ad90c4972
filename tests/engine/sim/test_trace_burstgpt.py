"""BurstGPT's CSV (HPMLL/BurstGPT): ``Timestamp,Model,Request tokens,Response tokens,
Total tokens,Log Type``, seconds from the trace's start, failed requests as 0 response
tokens, ChatGPT and GPT-4 mixed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.scenario import ScenarioError
from slopilot.engine.sim.trace import TraceError, read_trace
from slopilot.engine.sim.trace_scenario import TraceOptions

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
# The rows of BurstGPT's README and of BurstGPT_1.csv's shape: a failed request (0
# response tokens), an API log, and a GPT-4 row.
ROWS = ["5,ChatGPT,472,18,490,Conversation log",
        "45,ChatGPT,1087,230,1317,Conversation log",
        "60,ChatGPT,300,0,300,API log",
        "118,GPT-4,417,276,693,Conversation log",
        "130.5,GPT-4,20,3,23,API log"]


def _write(tmp_path: Path, lines: list[str], name: str = "BurstGPT_1.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _read(path: Path, **kw: str) -> list[tuple[float, int, int]]:
    return [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in read_trace(path, **kw)]


EXPECTED = [(0.0, 472, 18), (40.0, 1087, 230), (113.0, 417, 276), (125.5, 20, 3)]


def test_burstgpt_reads_seconds_and_lengths_and_skips_failed_requests(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slopilot.engine.sim.trace_public"):
        assert _read(_write(tmp_path, [HEADER, *ROWS])) == EXPECTED
    # The skip is said, with its count and the line of the first one.
    assert "skipped 1 failed request (Response tokens 0; the first on line 4)" in caplog.text


@pytest.mark.parametrize("header, rows", [
    # df.to_csv(path) after a filter: pandas writes its index as an unnamed first column.
    ("," + HEADER, [f"{i},{row}" for i, row in enumerate(ROWS)]),
    # Columns in another order, a file with another suffix (told by its header).
    ("Request tokens,Response tokens,Timestamp,Model",
     [",".join([r.split(",")[2], r.split(",")[3], r.split(",")[0], r.split(",")[1]])
      for r in ROWS]),
])
def test_burstgpt_columns_read_beside_an_index_and_in_any_order(
        tmp_path: Path, header: str, rows: list[str]) -> None:
    assert _read(_write(tmp_path, [header, *rows], name="slice.txt")) == EXPECTED


def test_the_format_can_be_named(tmp_path: Path) -> None:
    assert _read(_write(tmp_path, [HEADER, *ROWS], name="trace"), fmt="burstgpt") == EXPECTED


def test_rows_out_of_order_replay_by_time_as_in_every_format(tmp_path: Path) -> None:
    assert _read(_write(tmp_path, [HEADER, *reversed(ROWS)])) == EXPECTED


def test_one_models_rows_can_be_picked(tmp_path: Path) -> None:
    path = _write(tmp_path, [HEADER, *ROWS])
    assert _read(path, model="GPT-4") == [(0.0, 417, 276), (12.5, 20, 3)]
    assert _read(path, model="chatgpt") == [(0.0, 472, 18), (40.0, 1087, 230)]
    with pytest.raises(TraceError, match=r"BurstGPT_1.csv: no request of model 'Llama'; "
                       r"the trace's models: ChatGPT \(3 rows\), GPT-4 \(2 rows\)"):
        read_trace(path, model="Llama")


def test_a_model_filter_on_a_trace_without_models_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n0,5,5\n")
    with pytest.raises(TraceError, match=r"t.csv: a model filter \('GPT-4'\) needs "
                       r"a trace with a Model column \(BurstGPT's\); this one is csv"):
        read_trace(path, model="GPT-4")


def test_a_trace_of_only_failed_requests_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, [HEADER, "5,ChatGPT,472,0,472,API log", "6,GPT-4,3,0,3,API log"])
    with pytest.raises(TraceError, match=r"BurstGPT_1.csv: all 2 requests failed "
                       r"\(Response tokens 0\); nothing to replay"):
        read_trace(path)


@pytest.mark.parametrize("row, said", [
    ("-5,ChatGPT,472,18,490,Conversation log", r":3: Timestamp='-5' is not a time"),
    ("nan,ChatGPT,472,18,490,Conversation log", r":3: Timestamp='nan' is not a time"),
    ("1.7e12,ChatGPT,472,18,490,Conversation log",
     r":3: Timestamp=.1.7e12. as seconds is the year .*epoch milliseconds: divide the "
     r"column by 1,000 "),
    ("7,ChatGPT,-1,18,490,Conversation log", r":3: Request tokens='-1' must be a whole number"),
    ("7,ChatGPT,0,18,18,Conversation log", r":3: Request tokens='0' must be a whole number"),
    ("7,ChatGPT,472,nan,490,Conversation log", r":3: Response tokens='nan' must be a whole"),
    ("7,ChatGPT,472,99999999999,490,API log", r":3: Response tokens='99999999999' exceeds"),
    ("7,ChatGPT,472", r":3: expected 6 columns \('Timestamp,Model,Request tokens,"),
])
def test_a_bad_row_names_the_file_line_and_field(tmp_path: Path, row: str, said: str) -> None:
    path = _write(tmp_path, [HEADER, ROWS[0], row])
    with pytest.raises(TraceError, match="BurstGPT_1.csv" + said):
        read_trace(path)


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, ["Timestamp,Model,Request tokens,Total tokens,Log Type",
                             "5,ChatGPT,472,490,Conversation log"])
    with pytest.raises(TraceError, match=r"BurstGPT_1.csv:1: the header .* lacks "
                       r"Response tokens; BurstGPT's CSV has Timestamp,Model,Request tokens,"
                       r"Response tokens"):
        read_trace(path, fmt="burstgpt")


def test_another_csv_named_burstgpt_is_told_what_burstgpt_has(tmp_path: Path) -> None:
    path = _write(tmp_path, ["arrival_time,prompt_tokens,output_tokens", "0,5,5"])
    with pytest.raises(TraceError, match=r"lacks Timestamp, Request tokens, Response tokens"):
        read_trace(path, fmt="burstgpt")


def test_simulate_replays_a_burstgpt_file_and_one_model_of_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [HEADER, *ROWS])
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--json",
                 "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_arrived"] == 4 and out["requests_finished"] == 4
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--json",
                 "--quiet", "--trace-model", "GPT-4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_arrived"] == 2 and out["duration_s"] == 13.0  # 118 s to 130.5 s
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--quiet",
                 "--trace-model", "Llama"]) == 2
    assert "no request of model 'Llama'" in capsys.readouterr().err


def test_a_model_filter_names_a_model_and_a_trace_that_has_models(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, [HEADER, *ROWS])
    with pytest.raises(ScenarioError, match=r"--trace-model '': give a model the trace names"):
        TraceOptions(path=str(path), model=" ")
    # On a scenario's own trace (Azure's CSV, no models) it is refused, not ignored.
    assert main(["simulate", "--scenario", "azure-conv-2023", "--trace-model", "GPT-4",
                 "--quiet"]) == 2
    assert "needs a trace with a Model column (BurstGPT's); this one is csv" in \
        capsys.readouterr().err


def test_a_model_filter_that_only_looks_like_a_models_name_says_so(tmp_path: Path) -> None:
    """A Cyrillic С (U+0421) pasted from a chat reads as ChatGPT in the error, beside the
    trace's ChatGPT: the characters that are not ASCII are named."""
    path = _write(tmp_path, [HEADER, *ROWS])
    with pytest.raises(TraceError, match=r"no request of model 'Сhatgpt' \(its U\+0421 is no "
                       r"ASCII letter\); the trace's models: ChatGPT"):
        read_trace(path, model="\u0421hatgpt")
