"""A rollback whose apply fails is kept, retried with a growing wait and reported until it lands.

A tick that raises during an episode rolls every replica back to the episode's best (or
starting) config (``Controller._rollback``). When that apply raised too, the error was
logged ("the next tick retries from COOLDOWN"), but nothing retried: the trial's config,
possibly the one that broke the SLO, stayed on the replicas until some later episode
ended, and the decision said "rolled back to the best known config". The operator's
periodic sync puts the committed config back on its pods; the demo's local processes and
the simulated cluster have nothing that does. Now the restore is owed in the persisted
state (``LoopState.pending_restore``), tried again at the start of the tick once its wait
is over (``restore.py``), and no episode starts until it lands.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from slopilot.engine.config import ConfigError
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop import restore
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState, LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.sim.adapters import SimDeployment
from tests.tuner.controller_fakes import (
    BAD,
    GOOD,
    SLO,
    START,
    FakeAlerts,
    FakeOffline,
    FakePlanner,
    FakeProbe,
    FakeStudy,
    Rig,
    alert,
)

S = ControllerState
MAX_GAP_S = 60.0
"""The longest wait between two tries (``restore.RETRY_MAX_S``)."""


class Refusals:
    """``FakeDeployment.refuse``: every apply of a config not a trial's (a restore, a
    commit) fails while ``failing`` is above zero, each failure counted down; the time
    of every such apply is kept."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.now = 0.0
        self.tries: list[float] = []

    def __call__(self, config: Mapping[str, Any]) -> Exception | None:
        if dict(config) in (BAD, {"token_budget": 1024, "chunk_size": 1024}):
            return None  # a trial's config: the study's asks
        self.tries.append(self.now)
        if self.failing <= 0:
            return None
        self.failing -= 1
        return RuntimeError("replica unreachable")


def _crash(*_: Any, **__: Any) -> WindowSummary:
    raise RuntimeError("evaluator crashed")


def failed_rollback(failing: int, **rig_args: Any) -> tuple[Rig, Controller, Refusals]:
    """Trial 0 (BAD, which breaks P0) on the one replica; at t=5 the evaluator crashes
    and the rollback's apply fails (``failing`` applies in all)."""
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), offline=None,
              study=FakeStudy(queue=[dict(BAD)]), **rig_args)
    ctl = rig.build()
    assert ctl.tick(0.0).action is Action.TRIAL and rig.dep.config == BAD
    refusals = Refusals(failing)
    rig.dep.refuse = refusals
    assert rig.ev is not None
    rig.ev.measure = _crash  # type: ignore[method-assign]
    refusals.now = 5.0
    d = ctl.tick(5.0)
    assert (d.state, d.action) == (S.COOLDOWN, Action.REVERT)
    del rig.ev.measure  # the evaluator works again: only the restore is left to fail
    return rig, ctl, refusals


def test_a_rollback_that_fails_once_is_retried_at_the_next_tick() -> None:
    rig, ctl, refusals = failed_rollback(failing=1)
    assert rig.dep.config == BAD and refusals.tries == [5.0]
    refusals.now = 6.0
    d = ctl.tick(6.0)
    assert rig.dep.config == START and rig.dep.committed == START, d.line()
    assert (d.action, d.config) == (Action.REVERT, START)
    assert d.reason.startswith("restored:") and "after 1 failed attempt" in d.reason
    assert ctl.loop.pending_restore is None


def test_the_decision_of_a_failed_rollback_does_not_claim_one() -> None:
    _, ctl, _ = failed_rollback(failing=1)
    reason = ctl.loop.reason
    assert "rolled back to" not in reason, reason
    assert reason.startswith("rollback_failed: error: RuntimeError: evaluator crashed")
    assert "replica unreachable" in reason and "trial 0" in reason
    pending = ctl.loop.pending_restore
    assert pending is not None and (pending.attempts, pending.trial) == (1, 0)


def test_the_trials_config_does_not_outlive_the_failed_rollback() -> None:
    # Today's failure: the next episode never came (the alert cleared), so BAD stayed.
    rig, ctl, refusals = failed_rollback(failing=1)
    rig.alerts.alerts = []
    for t in range(6, 120):
        refusals.now = float(t)
        ctl.tick(float(t))
    assert rig.dep.config == START and rig.dep.committed == START


def test_retries_back_off_up_to_a_bound_and_no_episode_starts_meanwhile() -> None:
    rig, ctl, refusals = failed_rollback(failing=1000)
    decisions = []
    for t in range(6, 400):  # the retune alert fires throughout
        refusals.now = float(t)
        decisions.append(ctl.tick(float(t)))
    # The rollback's, the next tick's, then 5 s doubling up to MAX_GAP_S between tries.
    expected = [5.0, 6.0, 11.0, 21.0, 41.0, 81.0, 141.0, 201.0, 261.0, 321.0, 381.0]
    assert refusals.tries == expected
    gaps = [b - a for a, b in itertools.pairwise(expected)]
    assert max(gaps) == MAX_GAP_S and gaps[-1] == MAX_GAP_S
    assert rig.study.asked == 1 and rig.dep.config == BAD  # no trial since, BAD kept
    tried = [d for d in decisions if d.action is not Action.NONE]
    assert [d.reason.split(":")[0] for d in tried] == ["restore_failed"] * (len(expected) - 1)
    assert all(d.action is Action.REVERT and "trial 0" in d.reason for d in tried)
    held = [d for d in decisions if d.state is S.STEADY and d.reason != "cooldown over"
            and d.action is Action.NONE]
    assert held and all("restore_pending" in d.reason and "no episode starts" in d.reason
                        for d in held)
    # It lands: the episode the alert asks for starts at the next tick.
    refusals.failing = 0
    t = expected[-1] + MAX_GAP_S
    refusals.now = t
    d = ctl.tick(t)
    assert d.reason.startswith("restored:") and rig.dep.config == START
    assert ctl.tick(t + 1).action is Action.TRIAL and rig.study.asked == 2


def test_the_tries_are_counted_in_the_actions_metric() -> None:
    rig, ctl, refusals = failed_rollback(failing=3)
    for t in (6.0, 11.0, 21.0):
        refusals.now = t
        ctl.tick(t)

    def actions(reason: str) -> float:
        value = ctl.metrics.registry.get_sample_value(
            "slopilot_tuner_actions_total", {"slopilot_namespace": "",
                                             "slopilot_deployment": "demo",
                                             "action": "revert", "reason": reason})
        return value or 0.0

    assert (actions("rollback_failed"), actions("restore_failed"), actions("restored")) == (
        1.0, 2.0, 1.0)
    assert rig.dep.config == START


def test_a_pending_restore_survives_a_restart() -> None:
    rig, ctl, refusals = failed_rollback(failing=1)
    saved = json.loads(json.dumps(ctl.to_dict()))
    assert saved["pending_restore"]["attempts"] == 1
    successor = rig.build(LoopState.from_dict(saved))
    refusals.now = 7.0
    d = successor.tick(7.0)
    assert d.reason.startswith("restored:") and rig.dep.config == START


def test_a_scale_alert_still_scales_while_a_restore_is_pending() -> None:
    # Scaling applies no config: the replica an alert asks for is not held back.
    rig, ctl, refusals = failed_rollback(failing=1000, planner=FakePlanner(needed=2))
    rig.alerts.alerts = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    for t in range(6, 60):
        refusals.now = float(t)
        ctl.tick(float(t))
    assert rig.dep.scaled == [2] and rig.study.asked == 1


def _commit_fails(rig: Rig, refusals: Refusals) -> Controller:
    """GOOD holds; its commit fails, and so does the rollback to it (the best)."""
    ctl = rig.build()
    assert ctl.tick(0.0).config == GOOD
    rig.dep.refuse = refusals
    refusals.now = 10.0
    return ctl


def _cut_short(rig: Rig, refusals: Refusals) -> Controller:
    """BAD is cut short by the early look; its restore fails, and so does the rollback."""
    ctl = rig.build()
    assert ctl.tick(0.0).config == BAD
    rig.dep.refuse = refusals
    refusals.now = 5.0
    return ctl


@pytest.mark.parametrize(("make", "queue", "target"), [
    (_commit_fails, [], GOOD), (_cut_short, [dict(BAD)], START)],
    ids=["commit", "trial_cut_short"])
def test_every_apply_that_ends_an_episode_is_owed_until_it_lands(
        make: Callable[[Rig, Refusals], Controller], queue: list[dict[str, Any]],
        target: dict[str, Any]) -> None:
    rig = Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), study=FakeStudy(queue=queue),
              offline=FakeOffline() if not queue else None)
    refusals = Refusals(failing=2)
    ctl = make(rig, refusals)
    d = ctl.tick(refusals.now)
    assert (d.state, d.action) == (S.COOLDOWN, Action.REVERT)
    assert d.reason.startswith("rollback_failed"), d.line()
    assert ctl.loop.pending_restore is not None and rig.dep.committed == START
    refusals.now += 1
    d = ctl.tick(refusals.now)
    assert d.reason.startswith("restored:") and rig.dep.committed == target, d.line()


class FlakySim(SimDeployment):
    """The benchmark's handle, one apply of which fails when asked."""

    fail_next = False

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("simulated replica unreachable")
        super().apply_config(config, canary=canary, trial=trial)


class Crashing:
    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        return _crash()


def test_a_simulated_cluster_gets_its_config_back() -> None:
    scenario = load_scenario("tiny-cpu")
    cluster = SimCluster(scenario, dict(scenario.engine), replicas=1, seed=0, duration_s=5)
    dep, started = FlakySim(cluster), cluster.config.to_dict()
    settings = ControllerSettings(deployment="demo", slo=SLO, window_s=10, max_replicas=1)
    ctl = Controller(settings, dep, FakeAlerts([alert(AlertAction.RETUNE)]), Crashing(),
                     FakeStudy(queue=[dict(BAD)]), FakeProbe(), FakePlanner())
    assert ctl.tick(0.0).action is Action.TRIAL
    assert dep.current_config()["token_budget"] == BAD["token_budget"]
    dep.fail_next = True
    ctl.tick(5.0)  # the early look crashes; the rollback's apply fails
    assert dep.current_config()["token_budget"] == BAD["token_budget"]
    d = ctl.tick(6.0)
    assert d.reason.startswith("restored:"), d.line()
    assert dep.current_config() == started == dep.committed_config()


OLD = {"token_budget": 32768, "chunk_size": 2048}
"""A config an older release allowed (its wider token_budget range), which today's engine
refuses: the episode's starting config, as that release recorded it."""


class EngineRefuses:
    """``FakeDeployment.refuse``: ``refused`` is refused by the engine's rules
    (ConfigError, as the handle judges a config before any replica sees it); every other
    config fails to arrive ``unreachable`` times (a replica that does not answer)."""

    def __init__(self, refused: Mapping[str, Any], unreachable: int = 0) -> None:
        self.refused, self.unreachable = [dict(refused)], unreachable
        self.applied: list[dict[str, Any]] = []

    def __call__(self, config: Mapping[str, Any]) -> Exception | None:
        if dict(config) in self.refused:
            return ConfigError(f"token_budget={config['token_budget']} is out of range; "
                               "use a value in [128, 16384]", "token_budget")
        self.applied.append(dict(config))
        if self.unreachable <= 0:
            return None
        self.unreachable -= 1
        return RuntimeError("replica unreachable")


def owed_refused(refuses: EngineRefuses) -> tuple[Rig, Controller]:
    """An owed restore whose target, the episode's starting config, is ``OLD``."""
    rig, ctl, _ = failed_rollback(failing=1)
    ctl.loop.baseline_config = dict(OLD)
    rig.dep.refuse = refuses
    return rig, ctl


def test_a_restore_the_engine_refuses_falls_back_to_the_committed_config() -> None:
    """Every exception counted as a transport failure: the refused config was tried again
    after each wait, for ever, and no episode ever started. A refusal is no failure to
    wait out: the config is dropped, the committed one put back, and the restore ends."""
    refuses = EngineRefuses(OLD)
    rig, ctl = owed_refused(refuses)
    d = ctl.tick(6.0)
    assert (d.action, d.config) == (Action.REVERT, START), d.line()
    assert d.reason.startswith("restore_refused: the episode's starting config"), d.reason
    assert "token_budget=32768 is out of range" in d.reason and "committed" in d.reason
    assert ctl.loop.pending_restore is None and rig.dep.config == START
    assert restore.blocked(ctl, 7.0) is None  # the retune alert may start an episode
    for t in range(7, 200):
        ctl.tick(float(t))
    assert rig.study.asked > 1 and OLD not in refuses.applied


def test_a_committed_config_that_does_not_arrive_keeps_the_backoff() -> None:
    refuses = EngineRefuses(OLD, unreachable=3)
    rig, ctl = owed_refused(refuses)
    decisions = {t: ctl.tick(float(t)) for t in range(6, 42)}
    tried = {t: d for t, d in decisions.items() if d.action is Action.REVERT}
    # The next tick, then 5 s doubling: a replica that does not answer is waited for.
    assert list(tried) == [6, 11, 21, 41]
    assert [d.reason.split(":")[0] for d in tried.values()] == [
        "restore_failed"] * 3 + ["restore_refused"]
    assert all("token_budget=32768" in d.reason for d in tried.values())
    assert refuses.applied == [START] * 4 and rig.dep.config == START
    assert ctl.loop.pending_restore is None


def test_a_restore_refused_whole_ends_with_nothing_applied() -> None:
    refuses = EngineRefuses(OLD)
    rig, ctl = owed_refused(refuses)
    rig.dep.committed = dict(OLD)  # the committed config is refused too
    d = ctl.tick(6.0)
    assert d.action is Action.REVERT and d.reason.startswith("restore_refused:"), d.line()
    assert "nothing applied" in d.reason and d.config is None
    assert ctl.loop.pending_restore is None and rig.dep.config == BAD
