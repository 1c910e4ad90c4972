"""The figures ``tune`` prints in one row come from one window, and say which: the
deciding window's goodput beside its throughput and P99s, the windows' mean labelled as
the mean (it was printed as the worst window's)."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main


def _quiet_then_busy(path: Path) -> Path:
    # Quiet for 300 s, then 12 req/s of long prompts that one H100 cannot keep up with:
    # the busy window's goodput is far from the quiet ones', so their mean is neither.
    rng = random.Random(2)
    rows, t = [], 0.0
    while t < 420:
        t += rng.expovariate(0.3 if t < 300 else 12)
        rows.append((t, min(7800, int(rng.lognormvariate(7.6, 0.6))),
                     max(1, int(rng.lognormvariate(2.5, 0.8)))))
    path.write_text("arrival_time,prompt_tokens,output_tokens\n"
                    + "".join(f"{a:.4f},{p},{o}\n" for a, p, o in rows))
    return path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    trace = _quiet_then_busy(tmp_path_factory.mktemp("busy") / "busy.csv")
    argv = ["tune", "--trace", str(trace), "--trials", "1", "--replicas", "1",
            "--max-replicas", "1", "--quiet"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main([*argv, "--json"]) == 0
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    return json.loads(out.getvalue()), text.getvalue()


def test_a_configs_goodput_is_its_deciding_windows_beside_its_other_figures(
        tuned: tuple[dict[str, Any], str]) -> None:
    out, _ = tuned
    start = out["start"]
    windows = {w["span"]: w for w in start["windows"]}
    assert len(windows) > 1
    deciding = windows[start["deciding_window"]]
    assert start["goodput_tok_s"] == deciding["goodput_tok_s"]
    assert start["throughput_tok_s"] == deciding["summary"]["throughput_tok_s"]
    assert start["ttft_p99_ms"] == deciding["summary"]["ttft_p99_ms"]
    mean = sum(w["goodput_tok_s"] for w in windows.values()) / len(windows)
    assert start["goodput_tok_s_mean"] == pytest.approx(mean)
    # The windows differ enough that the mean is no window's figure.
    assert abs(start["goodput_tok_s_mean"] - start["goodput_tok_s"]) > 1.0


def test_the_tables_label_the_mean_and_the_deciding_window(
        tuned: tuple[dict[str, Any], str]) -> None:
    out, text = tuned
    flat = " ".join(text.split())
    assert "goodput tok/s, mean of windows" in flat, text
    assert "goodput tok/s, deciding window" in flat, text
    start = out["start"]
    # The comparison's rows carry each figure under its own label.
    row = next(line for line in text.splitlines() if "deciding window" in line
               and "goodput" in line and "│" in line)
    assert f"{start['goodput_tok_s']:,.0f}" in row, row
