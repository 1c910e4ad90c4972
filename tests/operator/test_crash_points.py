"""An operator killed at each step of a trial's life, and the operator that restarts.

A tick asks the study for a trial (RUNNING there from then on), applies its config
through the handle, and writes its loop state to ``status.controller``; a later tick
tells the study the trial's verdict and writes the state without it. A process killed
between any two of these (SIGKILL, an OOM, a node lost) leaves the steps before done and
the ones after not: here each crash is a ``Killed`` (a BaseException, which no
``except Exception`` of the loop catches) raised at that point, the dead daemon's
heartbeat stopped, and a fresh daemon built on the same cluster and study storage. What
a user expects after it: the pods on the committed config or on a trial the loop
watches, no trial of the study RUNNING once its grace period is over, none told twice,
and the verdict the study was told the one the loop acts on.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import dataclasses
import datetime
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.engine.window_summary import WindowSummary
from slopilot.operator import deployment_loop
from slopilot.operator.daemon import DaemonContext
from slopilot.operator.deployment_loop import DeploymentLoop
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.study.evaluator import ReplicaRestarted
from slopilot.tuner.study.heartbeat import GRACE_S
from tests.operator.operator_support import NS, Cluster, add_pod, daemon_loop
from tests.operator.standins import HOLDS, MoreReplicas, PrometheusStandIn, serving
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.operator.test_live_config import running, spec_config
from tests.support.kube_server import RunningEmulator
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import FakeProbe

# P0's TTFT P99 at 1.3 x its 100 ms SLO: a miss on 200 requests a class, not a breach
# (the early look cuts at 2 x).
MISSES = window({"p0": figures(130.0, 8.0, 50.0, throughput=55.0, finished=200),
                 "p1": figures(200.0, 40.0, 50.0, throughput=55.0, finished=200),
                 "p2": figures(300.0, 50.0, 50.0, finished=200)})


class Killed(BaseException):
    """The operator's process dies here."""


class Windows:
    """Every window reads as ``answer`` does now (the test sets it)."""

    answer: WindowSummary | Exception = HOLDS

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        if isinstance(Windows.answer, Exception):
            raise Windows.answer
        return Windows.answer


def build_windows_controller(ctx: DaemonContext) -> Controller:
    """``standins.build_study_controller`` with ``Windows``' verdicts."""
    from slopilot.operator.daemon import open_deployment_study
    from slopilot.tuner.study.live import ResumableTuner
    from slopilot.tuner.study.space import SearchSpace

    space = SearchSpace.from_bounds(base=ctx.spec.engine)
    study = open_deployment_study(ctx, space)
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    return Controller(settings, ctx.handle, AlertSource(ctx.spec.prometheus_url, ctx.name),
                      Windows(), ResumableTuner(study, space),
                      FakeProbe(), MoreReplicas(ctx), state=ctx.state)


@pytest.fixture(autouse=True)
def _holding() -> Any:
    Windows.answer = HOLDS
    yield
    Windows.answer = HOLDS


class World:
    """One CR tuning on a SQLite study, its one pod, a retune alert firing, and a clock."""

    def __init__(self, kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.body, self.policy, self.pod = tuning_cr(kube, cluster, prom, tmp_path)
        self.cluster, self.prom, self.monkeypatch = cluster, prom, monkeypatch
        self.db = tmp_path / "study.db"
        self.storage = self.policy.allowed_storage[0]
        self.now = [1_000_000.0]
        self.committed = spec_config(cluster)

    def daemon(self) -> DeploymentLoop:
        loop = daemon_loop(self.cluster, self.body, self.monkeypatch,
                           factory=build_windows_controller, policy=self.policy)
        loop.clock = lambda: self.now[0]
        return loop

    def killed(self, loop: DeploymentLoop) -> None:
        """``loop``'s step dies at a ``Killed``; its process (and heartbeat) with it."""
        with pytest.raises(Killed):
            loop.step()
        loop.close()

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return optuna.load_study(study_name=f"{NS}/chat/{self.body['metadata']['uid']}",
                                 storage=self.storage).trials

    def states(self) -> list[tuple[int, str]]:
        return [(t.number, t.state.name) for t in self.trials()]

    def grace_passes(self) -> None:
        """Every heartbeat made as old as the grace period makes a stale one."""
        old = datetime.datetime.now() - datetime.timedelta(seconds=GRACE_S + 60)
        with sqlite3.connect(self.db) as db:
            db.execute("UPDATE trial_heartbeats SET heartbeat = ?", (old.isoformat(" "),))

    def told_once(self) -> None:
        """No trial's window is in the study twice: each completed trial is its own or
        stands for a stale one that none other stands for."""
        told = [t.user_attrs.get("resumed_from_trial", t.number) for t in self.trials()
                if t.state is TrialState.COMPLETE]
        assert len(told) == len(set(told)), told

    def runs(self) -> dict[str, Any]:
        """The pod's knobs, of those the spec sets."""
        now = running(self.pod)
        return {k: now.get(k) for k in self.committed}

    def config_of(self, number: int) -> dict[str, Any]:
        return dict(self.trials()[number].user_attrs["config"])

    def recorded_trial(self) -> Any:
        return (self.cluster.status().get("controller") or {}).get("trial")


def on_trial(world: World, config: dict[str, Any]) -> bool:
    runs = running(world.pod)
    return all(runs.get(k) == v for k, v in config.items())


@pytest.fixture
def world(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
          monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    w = World(kube, cluster, prom, monkeypatch, tmp_path)
    with serving(w.pod):
        add_pod(cluster, "chat", 0, w.pod.port)
        yield w


def dies_at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
            when: Callable[..., bool] = lambda *a, **kw: True) -> None:
    """``owner.name`` raises ``Killed`` where ``when`` says so for its arguments."""
    real = getattr(owner, name)

    def dying(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            raise Killed(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, dying)


# --------------------------------------------------------------------- (a) ask | apply
def test_killed_after_the_ask_before_the_apply(world: World) -> None:
    """Trial 0 is RUNNING in the study, on no pod and on no record. The restarted loop
    starts its episode afresh with trial 1; trial 0, beaten for by no one, is failed as
    stale by the first ask past the grace period, and never told."""
    dead = world.daemon()
    with world.monkeypatch.context() as m:
        dies_at(m, dead.handle, "apply_config", lambda *a, trial=False, **kw: trial)
        world.killed(dead)
    assert world.states() == [(0, "RUNNING")]
    assert world.runs() == world.committed and not world.recorded_trial()
    restarted = world.daemon()
    world.grace_passes()
    assert restarted.step()
    assert world.states() == [(0, "FAIL"), (1, "RUNNING")]
    assert world.recorded_trial()["number"] == 1 and on_trial(world, world.config_of(1))
    world.now[0] += 3601.0
    assert restarted.step()  # trial 1 holds: committed
    restarted.close()
    assert world.states() == [(0, "FAIL"), (1, "COMPLETE")]
    assert world.runs() == {**world.committed, **world.config_of(1)}
    world.told_once()


# --------------------------------------------------------------- (b) apply | state write
def test_killed_after_the_apply_before_the_state_is_written(world: World) -> None:
    """Trial 0's config is on the pod and recorded there as a trial's, on no loop
    state. The alert has stopped by the restart: the restarted loop starts no episode,
    and its first step's sync puts the committed config back on the pod; trial 0 is
    failed as stale once the grace period is over."""
    dead = world.daemon()
    with world.monkeypatch.context() as m:
        dies_at(m, deployment_loop, "write_status")
        world.killed(dead)
    assert on_trial(world, world.config_of(0)) and not world.recorded_trial()
    world.prom.alerts.clear()
    restarted = world.daemon()
    assert restarted.step()
    assert world.runs() == world.committed
    assert "trial" not in (world.cluster.status().get("tunedConfig") or {})
    assert world.states() == [(0, "RUNNING")]  # within the grace period: it may live
    world.grace_passes()
    world.now[0] += 3601.0
    assert restarted.step()
    restarted.close()
    assert world.states() == [(0, "FAIL")]
    world.told_once()


# ------------------------------------------------------------ (c) state written | tell
@pytest.mark.parametrize("grace_passed", [False, True], ids=["in-grace", "stale"])
def test_killed_after_the_state_is_written_before_the_tell(world: World,
                                                           grace_passed: bool) -> None:
    """Trial 0 is on record and on the pod, its window over, not told. The restarted
    loop resumes it and tells its window once: in trial 0 while it still runs, or, failed
    as stale meanwhile, as one completed trial that stands for it; then commits it."""
    dead = world.daemon()
    assert dead.step()
    assert world.recorded_trial()["number"] == 0
    world.now[0] += 3601.0
    with world.monkeypatch.context() as m:
        assert dead.controller is not None
        dies_at(m, dead.controller.study, "tell")
        world.killed(dead)
    if grace_passed:
        world.grace_passes()
    restarted = world.daemon()
    assert restarted.step()
    restarted.close()
    told = [(0, "COMPLETE")] if not grace_passed else [(0, "FAIL"), (1, "COMPLETE")]
    assert world.states() == told
    world.told_once()
    assert not world.recorded_trial()
    assert world.cluster.status()["controller"]["state"] == "cooldown"
    assert world.runs() == {**world.committed, **world.config_of(0)}


# ------------------------------------------------------------- (d) tell | state write
def test_killed_after_a_failed_tell_before_the_state_is_written(world: World) -> None:
    """Trial 0 was told failed (its replica restarted under it), its rollback applied,
    and the state that says so never written. The restarted loop does not resume it
    (the study's reason says it ended: ``trial_ends.end_told``), puts the episode's
    config back and goes on with trial 1; trial 0 is told once."""
    dead = world.daemon()
    assert dead.step()
    world.now[0] += 3601.0
    Windows.answer = ReplicaRestarted("restarted", replicas=["chat-pod-0"])
    with world.monkeypatch.context() as m:
        dies_at(m, deployment_loop, "write_status")
        world.killed(dead)
    assert world.recorded_trial()["number"] == 0 and world.states() == [(0, "FAIL")]
    Windows.answer = HOLDS
    restarted = world.daemon()
    assert restarted.step()  # the owed restore
    assert world.runs() == world.committed and not world.recorded_trial()
    assert restarted.step()
    restarted.close()
    assert world.states() == [(0, "FAIL"), (1, "RUNNING")]
    assert world.recorded_trial()["number"] == 1


def test_killed_after_an_infeasible_tell_before_the_state_is_written(
        world: World) -> None:
    """Trial 0's window missed the SLO and the study was told so; the state saying the
    trial ended was never written. The window measured again later holds (the load fell
    meanwhile): judged again, the restarted loop committed a config its study holds
    infeasible. It acts on the verdict told: trial 0 is not resumed nor told again, and
    the episode goes on with trial 1, whose config replaces trial 0's on the pod, as
    after any infeasible trial."""
    dead = world.daemon()
    assert dead.step()
    world.now[0] += 3601.0
    Windows.answer = MISSES
    with world.monkeypatch.context() as m:
        dies_at(m, deployment_loop, "write_status")
        world.killed(dead)
    assert world.recorded_trial()["number"] == 0 and world.states() == [(0, "COMPLETE")]
    Windows.answer = HOLDS
    restarted = world.daemon()
    assert restarted.step()
    restarted.close()
    assert world.states() == [(0, "COMPLETE"), (1, "RUNNING")]
    world.told_once()
    assert world.recorded_trial()["number"] == 1
    assert not world.trials()[0].user_attrs["feasible"]
    assert on_trial(world, world.config_of(1))
    assert world.cluster.status()["controller"].get("best_config") is None


def test_killed_after_a_feasible_tell_and_its_commit_before_the_state_is_written(
        world: World) -> None:
    """Trial 0 held, the study was told so and its config committed to every replica;
    the state saying so was never written. The window measured again later misses:
    judged again, the restarted loop went on to trial 1 as if trial 0 had failed,
    beside a commit on record. It acts on the verdict told: trial 0's commit is made
    (again) and the loop cools down; nothing is told twice."""
    dead = world.daemon()
    assert dead.step()
    world.now[0] += 3601.0
    with world.monkeypatch.context() as m:
        dies_at(m, deployment_loop, "write_status")
        world.killed(dead)
    assert world.recorded_trial()["number"] == 0 and world.states() == [(0, "COMPLETE")]
    Windows.answer = MISSES
    restarted = world.daemon()
    assert restarted.step()
    restarted.close()
    assert world.states() == [(0, "COMPLETE")]
    assert not world.recorded_trial()
    assert world.cluster.status()["controller"]["state"] == "cooldown"
    assert world.runs() == {**world.committed, **world.config_of(0)}
