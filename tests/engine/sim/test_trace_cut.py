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


def _steady_then_short_burst(path: Path) -> Path:
    # 2 req/s of 500-token prompts over 0-300 s (120 arrivals a minute), then 100 requests
    # of 6,000 tokens within 3 s at 400 s: fewer arrivals than any kept minute, ten times
    # its tokens. Cut to 0:300 tune held on one replica; the whole trace held on none.
    rows = [f"{i * 0.5:.2f},500,50\n" for i in range(600)]
    rows += [f"{400 + i * 0.03:.2f},6000,50\n" for i in range(100)]
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "".join(rows))
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
    assert out.measure == "arrivals" and " arrivals, against " in text, text
    # A cut that keeps the burst, and no cut, say nothing.
    assert left_out(TraceSpec(str(trace), start_s=580.0), "--trace-window 580:") is None
    assert left_out(TraceSpec(str(trace)), "") is None


def test_busiest_minute_weighs_each_arrival_by_its_tokens_when_given_them() -> None:
    times = [0.0, 10.0, 70.0, 71.0, 72.0, 129.9]
    assert busiest_minute(times, [9_000, 9_000, 1, 1, 1, 1]) == (0.0, 18_000)


def test_a_cut_that_leaves_out_a_short_heavy_burst_says_so_by_its_tokens(
        tmp_path: Path) -> None:
    trace = _steady_then_short_burst(tmp_path / "t.csv")
    out = left_out(TraceSpec(str(trace), end_s=300.0), "--trace-window 0:300")
    assert out is not None
    assert out.measure == "tokens" and out.requests == 100 and out.of == 700
    assert out.busiest == 100 * 6_050 and out.kept_busiest == 120 * 550
    assert 340 < out.busiest_at_s <= 400
    assert ("605,000 tokens (prompt plus output), against 66,000 in the "
            "busiest minute kept") in out.text(), out.text()
    assert left_out(TraceSpec(str(trace), start_s=0.0, end_s=410.0),
                    "--trace-window 0:410") is None


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
