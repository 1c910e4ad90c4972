"""``slopilot demo`` end to end as a user runs it: its own process, a short run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slopilot.tuner.local.demo import DemoOptions
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
def test_demo_shows_the_alert_a_trial_and_writes_the_report(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    # A relative report directory, as the default one is: every process the demo starts
    # (replicas, Prometheus in its own working directory) must still find its files.
    proc = subprocess.run(
        [sys.executable, "-m", "slopilot.cli", "demo", "--duration", "60",
         "--report-dir", "report"], capture_output=True, text=True, timeout=180,
        check=False, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "ALERT firing: SlopilotTBTP99High[p0" in out, out
    assert "TRIAL" in out and "on canary" in out, out
    assert (report_dir / "report.md").is_file() and (report_dir / "timeline.png").is_file()
    assert "report written" in out and "report.md" in out


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 5, "max_replicas": 4}, "1 <= replicas <= max-replicas"),
    ({"duration_s": 5}, "--duration 5"),
])
def test_bad_demo_options_say_what_to_fix(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DemoOptions(**kwargs)  # type: ignore[arg-type]


def test_bad_demo_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    assert main(["demo", "--replicas", "0"]) == 2
    assert "replicas" in capsys.readouterr().err
