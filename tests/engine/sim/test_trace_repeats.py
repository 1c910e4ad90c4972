"""Rows that repeat another exactly (two overlapping exports joined): counted, named once
in a warning, and kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.trace import load_trace
from tests.engine.sim.test_trace import write

ROWS = ("0.000125,812,120\n", "0.250000,95,30\n", "1.020000,2048,400\n")
HEADER = "arrival_time,prompt_tokens,output_tokens\n"


def test_a_trace_joined_with_itself_is_counted_and_kept(tmp_path: Path) -> None:
    # docs/traces.md's join recipe applied to overlapping exports doubled every request
    # (identical µs times and lengths), and P1's TTFT p99 went from 530 ms to 33 s.
    path = write(tmp_path, "joined.csv", HEADER + "".join(ROWS) + "".join(ROWS))
    trace = load_trace(path)
    assert len(trace.records) == 6  # kept: two identical requests at once can be real
    assert trace.repeats is not None
    text = trace.repeats.text()
    assert text.startswith(f"{path}: 3 rows repeat an earlier row in every field read "
                           "(time, lengths, class, session, blocks; the first: line 5 "
                           "repeats line 2)"), text
    assert "kept" in text and "awk '!seen[$0]++'" in text, text


@pytest.mark.parametrize("second", [
    "0.000125,812,121,p1\n",  # another output
    "0.000125,812,120,p0\n",  # another class
    "0.000126,812,120,p1\n",  # another time
])
def test_rows_that_differ_in_any_field_read_are_no_repeats(tmp_path: Path,
                                                           second: str) -> None:
    path = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens,class\n"
                 "0.000125,812,120,p1\n" + second)
    assert load_trace(path).repeats is None


def test_a_session_id_tells_two_rows_apart(tmp_path: Path) -> None:
    rows = [{"arrival_time": 1.5, "prompt_tokens": 10, "output_tokens": 5, "session_id": s}
            for s in ("a", "b", "b")]
    path = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    repeats = load_trace(path).repeats
    assert repeats is not None and repeats.count == 1 and (repeats.line, repeats.of) == (3, 2)


def test_mooncakes_blocks_tell_two_rows_apart(tmp_path: Path) -> None:
    rows = [{"timestamp": 7, "input_length": 600, "output_length": 5, "hash_ids": h}
            for h in ([0, 1], [0, 2])]
    path = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert load_trace(path).repeats is None


def test_the_shipped_trace_has_no_repeats() -> None:
    assert load_trace("azure-llm-2023-conv").repeats is None


def test_simulate_warns_of_repeats_once(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "joined.csv", HEADER + "".join(ROWS) + "".join(ROWS))
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path),
                 "--quiet"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("rows repeat an earlier row") == 1, err
    assert f"slopilot simulate: warning: {path}: 3 rows repeat" in err, err
