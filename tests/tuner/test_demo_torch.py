"""``slopilot demo --executor torch``: the loop acting on measurements from a real engine.

One tiny-random replica on the torch executor, the real Prometheus evaluating the
deployment's rules over that replica's scraped series, and the production controller.
The SLO is one no CPU meets (P0/P1 TBT P99 0.5 ms: the alert threshold, twice that, is
the 1 ms bucket edge), so the alert fires from what the engine measured however fast or
slow the machine is; the run stops on a condition (a trial applied), never on a clock.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.local.demo import DemoOptions, run_demo
from slopilot.tuner.local.demo_story import DemoResult
from slopilot.tuner.local.deployment import LocalDeployment
from slopilot.tuner.local.loadgen import Phase
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.waits import HANG_GUARD_S

# Enough requests for every 8 s rate window to hold TBT samples of both classes.
LOAD = (Phase(4.0, 32, 8, {"p0": 0.3, "p1": 0.7}, 0.5, 64),
        Phase(4.0, 128, 8, {"p0": 0.5, "p1": 0.5}, 0.5, 256))


def _unmeetable_scenario(tmp_path: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(Path(load_scenario("demo-torch").source).read_text())
    doc["name"] = "demo-torch-unmeetable"
    doc["slo"]["classes"] = {"p0": {"ttft_p99_ms": 600000, "tbt_p99_ms": 0.5},
                             "p1": {"ttft_p99_ms": 600000, "tbt_p99_ms": 0.5}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.usefixtures("prometheus_binaries")
# The start (up to the hang guard for the replica, as much for Prometheus) and then the
# loop to its trial: above pytest's 300 s, so a slow start fails with its own message.
@pytest.mark.timeout(600)
def test_the_loop_retunes_a_real_engine_on_its_measured_alert(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def trial_applied(result: DemoResult, dep: LocalDeployment) -> bool:
        if result.trials < 1:
            return False
        seen["applied"], seen["live"] = dep.applied[-1], dep.current_config()
        return True

    opts = DemoOptions(executor="torch", model="tiny-random", replicas=1, max_replicas=1,
                       scenario=str(_unmeetable_scenario(tmp_path)), prometheus=True,
                       report_dir=tmp_path / "report", duration_s=1800, shift_at_s=5,
                       load=LOAD, until=trial_applied,
                       # A slow start on a loaded machine (tiny-random's load, torch's
                       # import) is waited for by condition; an exited replica fails at once.
                       ready_timeout_s=HANG_GUARD_S)
    out = io.StringIO()
    result = run_demo(opts, Console(file=out, width=400))
    text = out.getvalue()
    assert "replica(s) up (torch tiny-random on the CPU, --cpu-kernels auto)" in text, text
    assert "Prometheus http://127.0.0.1" in text, text
    # The alert came from Prometheus's rules over the replica's own TBT histogram.
    assert result.alert_at_s is not None and "ALERT firing: SlopilotTBTP99High[" in text, text
    # The trial went to the real engine: its /admin/config now answers the trial's knobs.
    assert result.trials >= 1, text
    config, canary = seen["applied"]
    assert canary is False  # one replica: the trial runs on all of them
    assert {k: seen["live"][k] for k in config} == config, (config, seen["live"])
    assert "trial 0 on all replicas" in text, text
    assert ("uncalibrated datasheet roofline (A100-80GB, tp=1) (a datasheet GPU, not this "
            "CPU") in text
    assert result.report.is_file()
