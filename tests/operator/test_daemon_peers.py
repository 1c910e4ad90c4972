"""Two daemons on one CR (two operator replicas before the peering has paused one, or a
replica run ``--standalone`` beside another): one episode, one trial running.

Each daemon ticked its own controller and wrote its state over the other's: both asked
a trial of the study (two RUNNING, each beaten for by its daemon), each put its config
on the pods, and the status named whichever was written last. Now a daemon writes
``status.controller`` only over the state it last read or wrote there; one that finds
another's state there drops its own (its trial told failed) and resumes the other's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.operator.crd import crd_manifest
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from tests.operator.operator_support import NS, Cluster, daemon_loop, llmd, operator_mint
from tests.operator.standins import PrometheusStandIn, build_study_controller
from tests.support.kube_server import RunningEmulator


def two_daemons(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                ) -> tuple[Any, Any, optuna.Study]:
    """A vLLM chat on a real study, with two daemons stepped once each (steady)."""
    kube.install(crd_manifest())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    body = cluster.create(llmd(backend="vllm", prometheus={"url": prom.url},
                               tuning={"window": "1h", "storage": storage}))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    a, b = (daemon_loop(cluster, cluster.get(), monkeypatch, factory=build_study_controller,
                        policy=policy) for _ in range(2))
    assert a.step() and b.step()
    study = optuna.load_study(study_name=f"{NS}/chat/{body['metadata']['uid']}",
                              storage=storage)
    return a, b, study


def states(study: optuna.Study) -> dict[int, TrialState]:
    return {t.number: t.state for t in study.get_trials(deepcopy=False)}


def on_record(cluster: Cluster) -> int | None:
    trial = (cluster.status().get("controller") or {}).get("trial")
    return None if trial is None else int(trial["number"])


def test_a_daemon_that_finds_anothers_trial_on_record_resumes_it(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    assert a.step() and on_record(cluster) == 0
    for _ in range(2):
        assert b.step() and a.step()
    assert states(study) == {0: TrialState.RUNNING}  # b asked none of its own
    assert on_record(cluster) == 0
    assert b.controller is not None and b.controller.loop.trial is not None
    assert b.controller.loop.trial.number == 0


def test_a_daemon_whose_tick_raced_anothers_write_drops_its_trial(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b, study = two_daemons(kube, cluster, prom, monkeypatch, tmp_path)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    tick = b.controller.tick

    def raced(now: float) -> Any:  # a writes its trial while b's tick is under way
        assert a.step()
        return tick(now)

    monkeypatch.setattr(b.controller, "tick", raced)
    assert b.step()
    assert on_record(cluster) == 0  # a's, not overwritten by b's
    assert states(study) == {0: TrialState.RUNNING, 1: TrialState.FAIL}
    assert "another" in study.trials[1].user_attrs["fail_reason"]
    assert b.step() and b.controller.loop.trial is not None
    assert b.controller.loop.trial.number == 0 and on_record(cluster) == 0
