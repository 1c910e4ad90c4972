"""The loop reads the deployment's committed config, never a trial's left on the replicas.

A controller that applied a trial to every replica (one replica, or canaries off) and was
then lost with its state (a restarted process; in the operator, a restart before the
state was written, or another replica's daemon) leaves that trial's config running. A new
controller's episode took it as its baseline: the rollback target and the warm start's
reference, a config nobody committed. The scale path planned replicas for it too.
``DeploymentHandle.committed_config`` is what the loop reads instead; each handle keeps
it (the operator's is tested in tests/operator/test_episode_baseline.py, the local
processes' in test_local_deployment.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.ports import DeploymentHandle
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.sim.adapters import SimDeployment, SimWindows
from tests.tuner.controller_fakes import (
    SLO,
    START,
    FakeAlerts,
    FakeDeployment,
    FakePlanner,
    FakeProbe,
    FakeStudy,
    Rig,
    alert,
)

TRIAL = {"token_budget": 4096, "chunk_size": 4096}
OTHER = {"token_budget": 1024, "chunk_size": 512}
SCENARIO = load_scenario("tiny-cpu")


def _sim() -> tuple[DeploymentHandle, dict[str, Any]]:
    cluster = SimCluster(SCENARIO, dict(SCENARIO.engine), replicas=2, seed=0, duration_s=5)
    return SimDeployment(cluster), cluster.config.to_dict()


def _fake() -> tuple[DeploymentHandle, dict[str, Any]]:
    return FakeDeployment(n=2), dict(START)


@pytest.mark.parametrize("make", [_sim, _fake], ids=["sim", "fake"])
def test_committed_config_follows_commits_not_trials(
        make: Callable[[], tuple[DeploymentHandle, dict[str, Any]]]) -> None:
    dep, started = make()
    assert dep.committed_config() == started
    dep.apply_config(TRIAL, canary=True, trial=True)
    dep.apply_config(TRIAL, canary=False, trial=True)  # a trial on every replica
    assert dep.committed_config() == started
    dep.apply_config(OTHER, canary=False)  # a commit, or a restore
    committed = dep.committed_config()
    assert {k: committed[k] for k in OTHER} == OTHER
    dep.apply_config(TRIAL, canary=False, trial=True)
    assert dep.committed_config() == committed


def lost_after_a_trial(rig: Rig) -> None:
    """A controller applies its first trial to the one replica, then is lost with its
    state: the trial's config stays on the replica."""
    d = rig.build().tick(0.0)
    assert d.action is Action.TRIAL and rig.dep.config == TRIAL and rig.dep.applied == [
        (TRIAL, False)]


def test_an_episode_over_a_trial_left_behind_begins_on_and_restores_the_committed() -> None:
    rig = Rig(offline=None, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              study=FakeStudy(queue=[dict(TRIAL)]), settings={"max_trials": 1})
    lost_after_a_trial(rig)
    ctl = rig.build()  # its successor, on a fresh state; the alert still fires
    d = ctl.tick(100.0)
    assert d.action is Action.TRIAL and ctl.loop.baseline_config == START
    d = ctl.tick(110.0)  # its one trial misses the SLO: the episode ends on its baseline
    assert "no_feasible_config" in d.reason, d.line()
    assert rig.dep.applied[-1] == (START, False) and rig.dep.config == START


def test_a_scale_up_over_a_trial_left_behind_is_planned_for_the_committed() -> None:
    rig = Rig(offline=None, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
              study=FakeStudy(queue=[dict(TRIAL)]), planner=FakePlanner(needed=3))
    lost_after_a_trial(rig)
    rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    d = rig.build().tick(100.0)
    assert (d.state, d.action) == (ControllerState.COOLDOWN, Action.SCALE), d.line()
    assert rig.planner.configs == [START]


def test_a_simulated_cluster_left_on_a_trial_gives_the_committed_baseline() -> None:
    """The same through the benchmark's handle: one simulated replica."""
    cluster = SimCluster(SCENARIO, dict(SCENARIO.engine), replicas=1, seed=0, duration_s=5)
    dep, started = SimDeployment(cluster), cluster.config.to_dict()
    settings = ControllerSettings(deployment="demo", slo=SLO, window_s=10, max_replicas=1)

    def build() -> Controller:
        return Controller(settings, dep, FakeAlerts([alert(AlertAction.RETUNE)]),
                          SimWindows(cluster), FakeStudy(queue=[dict(TRIAL)]),
                          FakeProbe(), FakePlanner())

    assert build().tick(0.0).action is Action.TRIAL
    assert dep.current_config()["token_budget"] == TRIAL["token_budget"]
    ctl = build()
    assert ctl.tick(1.0).action is Action.TRIAL
    assert ctl.loop.baseline_config == started
