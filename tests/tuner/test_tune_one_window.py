"""``slopilot tune``'s terminal output where each config was judged on one window (a
trace judged whole): it said "worst window" of the only window there was, where the
report (``study/verdict.judged_where``, the one rule for both) names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main


def test_a_trace_judged_whole_is_not_called_its_worst_window(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(
        f"{i * 0.05:.2f},500,20\n" for i in range(100)))
    assert main(["tune", "--trace", str(trace), "--windows", "whole", "--trials", "2",
                 "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "judged on the whole trace" in out, out
    assert "worst window" not in out, out
    assert "Top trials (each judged on the whole trace)" in out, out
    assert "(each term in the whole trace)" in out, out
    assert " on the whole trace, 0-5 s, 1 replica" in out, out


def test_several_windows_are_still_each_judged_on_the_worst(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--scenario", "tiny-cpu", "--trials", "1", "--duration", "4",
                 "--seeds", "2", "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Top trials (each judged on its worst window)" in out, out
    assert "(each term in its worst window)" in out, out
    assert " on its worst window, seed " in out, out
