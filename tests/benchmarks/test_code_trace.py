"""benchmarks/code_trace.py: a seeded code-assistant trace that slopilot reads as BurstGPT's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from slopilot.engine.sim.trace import read_trace

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "code_trace.py"


def _write(path: Path, seed: int, minutes: str = "5") -> str:
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(path), "--seed",
                          str(seed), "--minutes", minutes],
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_the_trace_reads_as_burstgpts_with_its_shape(tmp_path: Path) -> None:
    said = _write(tmp_path / "a.csv", 0)
    records = read_trace(tmp_path / "a.csv")  # told BurstGPT's by its header
    assert f"requests={len(records)}" in said.splitlines()[-1]
    prompts = np.array([r.prompt_tokens for r in records])
    outputs = np.array([r.output_tokens for r in records])
    assert 1500 < np.median(prompts) < 2600 and 20 < np.median(outputs) < 45
    gaps = np.diff([r.arrival_time for r in records])
    # Bursts: most requests come within a second of the one before, a few after long waits.
    assert np.median(gaps) < 0.1 and gaps.max() > 5


def test_one_seed_writes_one_trace(tmp_path: Path) -> None:
    _write(tmp_path / "a.csv", 3)
    _write(tmp_path / "b.csv", 3)
    _write(tmp_path / "c.csv", 4)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()


def test_a_span_of_no_minutes_is_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.csv"),
                          "--minutes", "0"], capture_output=True, text=True)
    assert out.returncode == 2 and "--minutes 0.0" in out.stderr
