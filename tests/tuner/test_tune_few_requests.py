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
    # "P1 94 of 100 requests" read as 94 out of 100 sent; it is 94 against a floor of 100.
    said = (f"P1 had 2 requests in 1 s, fewer than the {DEFAULT_CLASS_REQUESTS} the live "
            "loop judges a class on (min_class_requests)")
    assert said in verdict, verdict
    assert any(said in str(w) for w in out["warnings"]), out["warnings"]  # type: ignore[attr-defined]


def test_a_reports_warning_is_a_paragraph_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It ran into the "## SLO" heading below it, which markdown then did not render.
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n")
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--max-replicas", "1",
                 "--json", "--quiet", "--report-dir", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Warning: Judged on few requests" in text
    assert "\n\n## SLO\n" in text, text


def test_a_verdict_on_enough_requests_says_nothing_of_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "many.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(
        f"{i * 0.5:.1f},100,10\n" for i in range(400)))
    out = _tune(trace, capsys)
    assert "requests in" not in str(out["verdict"]), out["verdict"]
    assert out["warnings"] == []


def _thin_trace(path: Path) -> Path:
    """200 requests over 2 days: a trace of milliseconds (2.9 minutes) read as seconds."""
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(
        f"{i * 864},100,10\n" for i in range(201)))
    return path


def test_a_verdict_on_a_thin_trace_names_its_span_and_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A reviewer's trace of millisecond offsets read as seconds (1,530 requests over 8.6
    # days) "held" with a "few requests" note only, nothing tying it to the time unit.
    out = _tune(_thin_trace(tmp_path / "ms.csv"), capsys)
    said = ("201 requests over 2.0 days (172,800 s) at 0.0012 req/s, under one request a "
            "60 s window on average")
    assert said in str(out["verdict"]), out["verdict"]
    assert "if its times are milliseconds, give --time-scale 0.001" in str(out["verdict"])
    assert any(said in str(w) for w in out["warnings"]), out["warnings"]  # type: ignore[attr-defined]
    # At the scale it names, the trace is busy enough: nothing is said.
    assert main(["tune", "--trace", str(tmp_path / "ms.csv"), "--time-scale", "0.001",
                 "--trials", "1", "--max-replicas", "1", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "req/s, under one request" not in str(out["verdict"]), out["verdict"]


def test_simulate_names_a_thin_traces_span_and_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _thin_trace(tmp_path / "ms.csv")
    assert main(["simulate", "--trace", str(trace), "--quiet", "--json"]) == 0
    err = capsys.readouterr().err
    assert ("slopilot simulate: warning: the replayed trace is 201 requests over 2.0 days "
            "(172,800 s) at 0.0012 req/s") in err, err
    # A target rate is the user's pace: no time unit to suggest.
    assert main(["simulate", "--trace", str(trace), "--target-rate", "0.001", "--quiet",
                 "--json"]) == 0
    assert "--time-scale" not in capsys.readouterr().err
