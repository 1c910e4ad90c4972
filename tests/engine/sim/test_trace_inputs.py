"""What a user's own trace file commonly holds that a reader got wrong or refused without
saying what to do: lengths pandas wrote as floats, a JSON array, two CSVs joined, Excel's
``sep=`` line, odd session ids, a negative window start, an absurd target rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.trace import TraceError, read_trace, rescale

HEADER = "arrival_time,prompt_tokens,output_tokens\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("written", ["374.0", "374.", "3.74e2", "3740e-1", "+374.000"])
def test_a_csv_length_written_as_a_whole_float_is_read_as_jsonl_reads_it(
        tmp_path: Path, written: str) -> None:
    # pandas writes a length so once its column held a NaN (df.to_csv).
    path = _write(tmp_path, "p.csv", f"{HEADER}0,{written},44.0\n1,10,5\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in read_trace(path)] == [
        (374, 44), (10, 5)]
    jsonl = _write(tmp_path, "p.jsonl", json.dumps(
        {"arrival_time": 0, "prompt_tokens": 374.0, "output_tokens": 44.0}) + "\n")
    assert read_trace(jsonl)[0].prompt_tokens == 374


@pytest.mark.parametrize("name", ["p.csv", "p.jsonl"])
def test_a_fractional_length_is_refused_as_not_whole(tmp_path: Path, name: str) -> None:
    text = (f"{HEADER}0,374.5,44\n" if name.endswith(".csv") else json.dumps(
        {"arrival_time": 0, "prompt_tokens": 374.5, "output_tokens": 44}) + "\n")
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceError, match=rf"{name}:\d: prompt_tokens='?374\.5'? is not a "
                                         r"whole number of tokens; .*374 or 375"):
        read_trace(path)


def test_a_json_array_says_the_file_is_read_as_json_lines_and_how_to_convert(
        tmp_path: Path) -> None:
    rows = [{"arrival_time": i, "prompt_tokens": 5, "output_tokens": 5} for i in range(2)]
    path = _write(tmp_path, "t.json", json.dumps(rows))
    with pytest.raises(TraceError, match=r"t\.json:1: .*JSON Lines, one object per line.*"
                                         r"jq -c '\.\[\]' .*t\.json > .*t\.jsonl"):
        read_trace(path)


def test_two_csvs_joined_with_cat_name_the_header_that_repeats(tmp_path: Path) -> None:
    path = _write(tmp_path, "j.csv", f"{HEADER}0,5,5\n1,5,5\n{HEADER}2,5,5\n")
    with pytest.raises(TraceError, match=r"j\.csv:4: the header row repeats here"):
        read_trace(path)
    azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    path = _write(tmp_path, "a.csv", f"{azure}0,5,5\n{azure}1,5,5\n")
    with pytest.raises(TraceError, match=r"a\.csv:3: the header row repeats here"):
        read_trace(path)


def test_excels_sep_line_is_skipped_and_another_separator_said(tmp_path: Path) -> None:
    path = _write(tmp_path, "x.csv", f"sep=,\n{HEADER}0,5,5\n1,7,5\n")
    assert [r.prompt_tokens for r in read_trace(path)] == [5, 7]
    path = _write(tmp_path, "y.csv", "sep=;\narrival_time;prompt_tokens;output_tokens\n0;5;5\n")
    with pytest.raises(TraceError, match=r"y\.csv:1: .*sep=;.*commas"):
        read_trace(path)
    bad = _write(tmp_path, "z.csv", f"sep=,\n{HEADER}0,x,5\n")
    with pytest.raises(TraceError, match=r"z\.csv:3: prompt_tokens='x'"):
        read_trace(bad)


@pytest.mark.parametrize("value", ["true", "false", "{\"a\": 1}", "[1]", "NaN"])
def test_a_session_id_that_names_no_session_is_refused(tmp_path: Path, value: str) -> None:
    path = _write(tmp_path, "s.jsonl",
                  '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5, '
                  '"session_id": 1}\n'
                  '{"arrival_time": 1, "prompt_tokens": 9, "output_tokens": 5, '
                  f'"session_id": {value}}}\n')
    with pytest.raises(TraceError, match=r"s\.jsonl:2: session_id=.* a string or a number"):
        read_trace(path)


def test_equal_numbers_are_one_session_and_a_string_another(tmp_path: Path) -> None:
    rows = [{"arrival_time": i, "prompt_tokens": 5 + i, "output_tokens": 5, "session_id": s}
            for i, s in enumerate([1, 1.0, "1"])]
    path = _write(tmp_path, "s.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r.session_id for r in read_trace(path)] == [0, 0, 1]


def test_a_negative_window_start_is_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "t.csv", f"{HEADER}0,5,5\n1,5,5\n")
    for argv in (["--trace-window", "-5:10"], ["--trace-window=-5:10"]):
        assert main(["simulate", "--trace", str(path), "--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert "expected one argument" not in err
        assert "--trace-window start -5: trace seconds count from the first request" in err


def test_an_absurd_target_rate_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    records = read_trace("azure-llm-2023-conv")[:100]
    with pytest.raises(TraceError, match=r"target_rate=1e\+300: .*1,000,000 req/s"):
        rescale(records, target_rate=1e300)
    path = _write(tmp_path, "t.csv", f"{HEADER}0,5,5\n1,5,5\n")
    assert main(["simulate", "--trace", str(path), "--quiet", "--target-rate", "1e300"]) == 2
    assert "--target-rate 1e+300: " in capsys.readouterr().err


def test_burstgpt_behind_excels_sep_line_is_still_told_by_its_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "b.csv", "sep=,\nTimestamp,Model,Request tokens,Response tokens,"
                  "Total tokens,Log Type\n5,ChatGPT,100,20,120,Conversation log\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in read_trace(path)] == [(100, 20)]
