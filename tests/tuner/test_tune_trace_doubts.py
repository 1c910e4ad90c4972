"""``tune`` says what ``simulate`` says of a trace as read: a Mooncake file in seconds
(replayed 1000 times too fast) and rows that repeat another, on stderr and in --json's
warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main


def _tune(trace: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--max-replicas", "1",
                 "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    return [str(w) for w in json.loads(captured.out)["warnings"]], captured.err


def test_tune_warns_of_a_mooncake_trace_in_seconds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The reviewer's file: tune sized 5 replicas, the same rows in milliseconds held on 1.
    path = tmp_path / "sec.jsonl"
    path.write_text("".join(json.dumps({"timestamp": round(i * 0.5 + 0.013, 3),
                                        "input_length": 300, "output_length": 20}) + "\n"
                            for i in range(40)))
    warnings, err = _tune(path, capsys)
    said = f"{path}: 40 of its 40 timestamps are fractional milliseconds"
    assert any(w.startswith(said) for w in warnings), warnings
    assert f"slopilot tune: warning: {said}" in " ".join(err.split()), err


def test_tune_warns_of_repeated_rows(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    rows = "".join(f"{i * 0.5:.6f},100,10\n" for i in range(40))
    path = tmp_path / "joined.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + rows + rows)
    warnings, err = _tune(path, capsys)
    said = f"{path}: 40 rows repeat an earlier row in every field read"
    assert any(w.startswith(said) for w in warnings), warnings
    assert f"slopilot tune: warning: {said}" in " ".join(err.split()), err
