"""What a user's own trace file commonly holds that a reader got wrong or refused without
saying what to do: lengths pandas wrote as floats, a JSON array, two CSVs joined, Excel's
``sep=`` line, odd session ids, a negative window start, an absurd target rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.engine.sim.trace import TraceError, read_trace

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
