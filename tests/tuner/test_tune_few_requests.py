"""A verdict on a P99 of a handful of requests says how few (``sample_floor``'s words,
the live loop's ``min_class_requests``): a reviewer's 2-request trace got "holds the
SLO ... closest term at 5%" with no warning, a P99 that is the larger of two TTFTs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.tuner.loop.settings import DEFAULT_CLASS_REQUESTS


def _tune(trace: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--max-replicas", "1",
                 "--json", "--quiet"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_a_verdict_on_two_requests_says_it_is_judged_on_two(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n")
    out = _tune(trace, capsys)
    verdict = str(out["verdict"])
    assert f"P1 2 of {DEFAULT_CLASS_REQUESTS} requests" in verdict, verdict
    assert any("P1 2 of" in str(w) for w in out["warnings"]), out["warnings"]  # type: ignore[attr-defined]


def test_a_verdict_on_enough_requests_says_nothing_of_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "many.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(
        f"{i * 0.5:.1f},100,10\n" for i in range(400)))
    out = _tune(trace, capsys)
    assert "requests in" not in str(out["verdict"]), out["verdict"]
    assert out["warnings"] == []
