"""A cut of a trace that leaves out a busier minute than it keeps is said, by ``simulate``
and ``tune``: a verdict on a quiet start says nothing of the burst after it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.trace_cut import busiest_minute, left_out
from slopilot.engine.sim.workload_spec import TraceSpec


def _quiet_then_busy(path: Path) -> Path:
    # 0.3 req/s for 600 s, then 6 req/s for 120 s: the busy minutes lie past 540 s.
    rng = random.Random(2)
    rows, t = [], 0.0
    while t < 720:
        t += rng.expovariate(0.3 if t < 600 else 6)
        rows.append(t)
    path.write_text("arrival_time,prompt_tokens,output_tokens\n"
                    + "".join(f"{a:.4f},300,10\n" for a in rows))
    return path


def test_busiest_minute_counts_the_arrivals_of_the_fullest_sixty_seconds() -> None:
    assert busiest_minute([]) == (0.0, 0)
    assert busiest_minute([0.0, 10.0, 70.0, 71.0, 72.0, 129.9]) == (70.0, 4)


def test_a_cut_that_keeps_the_quiet_start_names_what_it_leaves_out(tmp_path: Path) -> None:
    trace = _quiet_then_busy(tmp_path / "t.csv")
    out = left_out(TraceSpec(str(trace), end_s=540.0), "--trace-window 0:540")
    assert out is not None
    assert out.of > out.requests > 500 and out.busiest > 4 * out.kept_busiest
    assert 540 <= out.busiest_at_s <= 720
    text = out.text()
    assert text.startswith(f"--trace-window 0:540: leaves out {out.requests:,} of the "
                           f"trace's {out.of:,} requests"), text
    # A cut that keeps the burst, and no cut, say nothing.
    assert left_out(TraceSpec(str(trace), start_s=580.0), "--trace-window 580:") is None
    assert left_out(TraceSpec(str(trace)), "") is None


def test_tune_and_simulate_warn_of_a_cut_that_leaves_the_burst_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _quiet_then_busy(tmp_path / "t.csv")
    assert main(["tune", "--trace", str(trace), "--trace-window", "0:540", "--trials", "1",
                 "--quiet", "--json"]) == 0
    captured = capsys.readouterr()
    warnings = json.loads(captured.out)["warnings"]
    assert any(w.startswith("--trace-window 0:540: leaves out ") for w in warnings), warnings
    assert "slopilot tune: warning: --trace-window 0:540: leaves out " in captured.err
    assert main(["simulate", "--trace", str(trace), "--trace-window", "0:540",
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "slopilot simulate: warning: --trace-window 0:540: leaves out " in err, err
