"""The generators of checked-in files (dashboards, CRD, rules, inhibitions, the transition
table): ``--help`` prints usage and writes nothing, an unknown argument is an error and
writes nothing (``python -m slopilot.operator.dashboards --help`` used to rewrite both
dashboards)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from slopilot.operator.dashboards import dashboard_path, vllm_dashboard_path
from slopilot.tuner.prometheus.inhibitions import manifest_path
from slopilot.tuner.prometheus.rules import example_path

ROOT = Path(__file__).resolve().parents[1]
WRITTEN: dict[str, Callable[[], list[Path]]] = {
    "slopilot.operator.dashboards": lambda: [dashboard_path(), vllm_dashboard_path()],
    "slopilot.operator.crd": lambda: [],
    "slopilot.tuner.prometheus.rules": lambda: [example_path()],
    "slopilot.tuner.prometheus.inhibitions": lambda: [manifest_path()],
    "slopilot.tuner.loop.transitions": lambda: [],
}


def stamps(module: str) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in WRITTEN[module]()}


@pytest.mark.parametrize("module", sorted(WRITTEN))
def test_help_prints_usage_and_writes_nothing(module: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = stamps(module)
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and f"python -m {module}" in out
    assert stamps(module) == before


@pytest.mark.parametrize("module", sorted(WRITTEN))
def test_an_unknown_argument_is_an_error_and_writes_nothing(
        module: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = stamps(module)
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(["--out", "x.json"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --out x.json" in capsys.readouterr().err
    assert stamps(module) == before


def test_the_transition_table_still_prints_with_its_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.tuner.loop.transitions import main, render_diagram, render_table
    assert main(["--table"]) == 0
    assert capsys.readouterr().out == render_table() + "\n"
    assert main([]) == 0
    assert capsys.readouterr().out == render_diagram() + "\n"


def test_python_dash_m_dashboards_help_writes_no_dashboard() -> None:
    before = stamps("slopilot.operator.dashboards")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "slopilot.operator.dashboards", "--help"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert run.returncode == 0 and run.stdout.startswith("usage:"), run.stdout + run.stderr
    assert "wrote" not in run.stdout
    assert stamps("slopilot.operator.dashboards") == before
