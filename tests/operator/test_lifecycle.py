"""Across a deployment's life, what the operator records stays what runs: tuning turned
off and on, an operator restart, a CR re-created, replicas scaled by someone else."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import contextlib
import dataclasses
import logging
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.operator.cr_locks import LockTable
from slopilot.operator.daemon import DaemonContext
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.kubeapi import ApiError
from slopilot.operator.loop_status import tuning_enabled
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.pod_syncs import sync_pods
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec_status import status_of
from slopilot.operator.status_writer import write_status
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.ports import SimulatorBusy
from slopilot.tuner.prometheus.alerts import AlertSource
from tests.operator.operator_support import (
    NS,
    Cluster,
    add_pod,
    daemon_loop,
    llmd,
)
from tests.operator.standins import (
    HoldingWindows,
    PodStandIn,
    PrometheusStandIn,
    build_study_controller,
    serving,
)
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.operator.test_live_config import reconciled, running, spec_config
from tests.support.kube_server import RunningEmulator
from tests.tuner.controller_fakes import GOOD, FakeProbe, FakeStudy


def handler_reconcile(cluster: Cluster, policy: Any, mint: Any) -> None:
    """What ``reconcile_llmdeployment`` does for the CR as it is now: its status, and
    with tuning off, the pods' sync."""
    body = cluster.get()
    outcome = reconcile(cluster.kube, body, policy=policy, mint=mint)
    write_status(cluster.kube, NS, "chat", lambda fresh: status_of(fresh, outcome))
    if outcome.valid and outcome.admin_token and not tuning_enabled(body["spec"]):
        # The locks: the sync takes the CR's around its writes (status.tunedConfig).
        memo = types.SimpleNamespace(kube=cluster.kube, tokens=mint, policy=policy,
                                     locks=LockTable())
        sync_pods(body, memo, logging.getLogger("test"))  # type: ignore[arg-type]


@contextlib.contextmanager
def _in_a_trial(cluster: Cluster, body: dict[str, Any], mint: Any, prom: PrometheusStandIn,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, PodStandIn]]:
    """The CR's daemon and its one pod, serving, after the daemon's first step on a
    retune alert: a trial running on the pod."""
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    loop = daemon_loop(cluster, body, monkeypatch)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        assert loop.step()
        yield loop, pod


def test_tuning_turned_off_mid_trial_says_the_deployment_no_longer_tunes(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile kept a daemon's phase, and the daemon that ended wrote only its
    loop state: a CR whose tuning was turned off mid-trial said phase Tuning and
    Tuning=True ("trial 0 on all replicas") for good, its pods on the restored config."""
    body, policy, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h"}))
    with _in_a_trial(cluster, body, mint, prom, monkeypatch) as (loop, pod):
        status = cluster.status()
        assert status["controller"]["trial"] is not None and status["phase"] == "Tuning"
        controller = loop.controller
        tick = controller.tick

        def turned_off_during(now: float, **kw: Any) -> Any:  # the edit lands mid-tick
            decision = tick(now, **kw)
            cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
            handler_reconcile(cluster, policy, mint)  # the update handler
            return decision

        monkeypatch.setattr(controller, "tick", turned_off_during)
        assert loop.step()  # its state written after the reconcile's status
        loop.abandon("tuning was disabled during the trial", restore=True)  # its end
        status = cluster.status()
        assert status["controller"].get("trial") is None
        assert pod.config == spec_config(cluster)
        tuning = next(c for c in status["conditions"] if c["type"] == "Tuning")
        assert (status["phase"], tuning["status"], tuning["reason"]) == \
            ("Running", "False", "Disabled")


def test_a_switch_in_the_edit_that_turns_tuning_off_fails_the_trial_with_the_switch(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One edit switches the model and turns tuning off mid-trial: the daemon's end
    rebases the episode before it stops it, and the switch ended the trial there, which
    the stop then no longer saw: it was left RUNNING in its study, to go stale."""
    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, tuning={"window": "1h"}))
    with _in_a_trial(cluster, body, mint, prom, monkeypatch) as (loop, _pod):
        study = loop.controller.study
        number = loop.controller.loop.trial.number
        cluster.patch("chat", {"spec": {"model": {"name": "tiny-random"},
                                        "tuning": {"enabled": False}}})
        loop.abandon("tuning was disabled during the trial", restore=True)
        assert study.failed.get(number, "").startswith("engine_switched: "), study.failed
        assert cluster.status()["controller"].get("trial") is None


@pytest.mark.parametrize("ended_by", ["daemon", "reconcile"])
@pytest.mark.parametrize("left", ["trial", "tuning", "commit", "scaling", "owed"])
def test_tuning_turned_on_again_waits_in_steady_for_an_alert(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, left: str, ended_by: str) -> None:
    """Turning tuning off failed the running trial but left the episode's state in
    ``status.controller``; turned on again, the new daemon resumed it (a TUNING loop asked
    its next trial, COMMIT and SCALING scaled up) with no alert firing. ``left``: a
    trial the first daemon ran, or a state on record that it ended before stepping.
    ``ended_by``: the daemon's end, or, where no daemon saw tuning off (the operator was
    down, and its resume handler reconciles the CR), the reconcile's status. ``owed``: an
    episode whose rollback failed, its restore still owed in ``steady``: kept, it was
    applied when tuning came back on, with no alert (the sync restores the pods while
    tuning is off)."""
    body, _, mint = reconciled(kube, cluster, llmd(
        prometheus={"url": prom.url}, replicas={"min": 1, "max": 4},
        tuning={"window": "1h"}))
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = daemon_loop(cluster, body, monkeypatch)
        if left == "trial":
            prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
            assert first.step()
            assert cluster.status()["controller"]["trial"] is not None
        else:
            saved: dict[str, Any] = {"state": left, "since": 0.0,
                                     "reason": "an episode under way"}
            if left == "owed":
                saved = {"state": "steady", "since": 0.0, "reason": "rollback_failed",
                         "baseline_config": spec_config(cluster),
                         "pending_restore": {"since": 0.0, "attempts": 1, "retry_at": 0.0,
                                             "error": "RuntimeError: unreachable"}}
            cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {
                "status": {"controller": saved}}, subresource="status")
        cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
        if ended_by == "daemon":
            first.abandon("tuning was disabled during the trial", restore=True)  # its end
        else:
            outcome = reconcile(cluster.kube, cluster.get(), policy=OperatorPolicy(),
                                mint=mint)
            write_status(cluster.kube, NS, "chat", lambda fresh: status_of(fresh, outcome))
        prom.alerts = []
        cluster.patch("chat", {"spec": {"tuning": {"enabled": True}}})
        again = daemon_loop(cluster, cluster.get(), monkeypatch)
        assert again.step()
        saved = cluster.status()["controller"]
        assert (saved["state"], saved.get("trial")) == ("steady", None)
        assert saved.get("pending_restore") is None
        assert (cluster.status().get("lastAction") or {}).get("action") != "revert"
        assert cluster.kube.get("apps/v1", "deployments", NS, "chat")["spec"]["replicas"] == 1
        assert pod.config == spec_config(cluster)


def test_the_state_an_ended_daemon_writes_replaces_the_one_on_record(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's end wrote ``status.controller`` as a merge patch: the maps of the
    state on record (a twin check's classes and learned factors) kept every key the
    ended state lacked, merged into it, and a restarted controller read that mix."""
    from slopilot.operator import deployment_loop
    from slopilot.tuner.loop.state import LoopState

    body, _, mint = reconciled(kube, cluster, llmd(prometheus={"url": prom.url},
                                                   tuning={"window": "1h"}))
    cell = {"ttftP99PredictedMs": 90.0, "ttftP99MeasuredMs": 80.0}
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "controller": {"twin": {"trusted": True, "classes": {"p0": cell, "p1": cell},
                                "correctionFactors": {"attention": 1.2}}}}},
        subresource="status")
    with _in_a_trial(cluster, body, mint, prom, monkeypatch) as (loop, _):
        assert set(cluster.status()["controller"]["twin"]["classes"]) == {"p0", "p1"}
        controller = loop.controller
        tick = controller.tick

        def checked(now: float, **kw: Any) -> Any:  # measured p0 only, learned nothing
            decision = tick(now, **kw)
            controller.loop.twin = {"trusted": False, "classes": {"p0": cell},
                                    "correctionFactors": {}}
            return decision

        def unwritten(*_: Any, **__: Any) -> Any:
            raise ApiError(500, "InternalError", "the API server went away")

        monkeypatch.setattr(controller, "tick", checked)
        with monkeypatch.context() as m:
            m.setattr(deployment_loop, "write_status", unwritten)
            assert loop.step()
        cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
        loop.abandon("tuning was disabled during the trial", restore=True)  # its end
    saved = cluster.status()["controller"]
    assert saved["twin"] == controller.loop.twin
    assert LoopState.from_dict(saved) == controller.loop


def test_a_trial_told_before_a_restart_is_not_counted_again_after_it(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The study was told the trial's window, then its status write failed and the
    operator restarted: the status still had the trial running, so the restarted
    controller measured it again and ``ResumableTuner.tell``, meant for a trial failed
    as stale, added a second completed trial of the same config to the study."""
    from slopilot.operator import deployment_loop

    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    now = [1_000_000.0]

    def started() -> Any:
        loop = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                           policy=policy)
        loop.clock = lambda: now[0]
        return loop

    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = started()
        assert first.step()
        assert cluster.status()["controller"]["trial"]["number"] == 0
        now[0] += 3601.0  # the window is over: the next tick tells the study

        def unwritten(*_: Any, **__: Any) -> Any:
            raise ApiError(500, "InternalError", "the API server went away")

        with monkeypatch.context() as m:
            m.setattr(deployment_loop, "write_status", unwritten)
            assert first.step()
        assert first.unwritten is not None  # the operator stops before writing it again
        assert cluster.status()["controller"]["trial"]["number"] == 0
        restarted = started()
        assert restarted.step()
    study = optuna.load_study(study_name=f"{NS}/chat/{body['metadata']['uid']}",
                              storage=storage)
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE]
    assert len(complete) == 1, [(t.number, t.user_attrs.get("resumed_from_trial"))
                                for t in complete]


def test_a_restarted_operator_beats_for_the_trial_it_resumes(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The restarted operator's study beat only for trials it asked: the trial it
    resumed from ``status.controller`` went stale once its window outlasted the grace
    period, and was failed, its window then added as another trial."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                            policy=policy)
        assert first.step()
        first.controller.study.close()  # the operator stops: its beats with it
        restarted = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                                policy=policy)
        assert restarted.step()
        assert cluster.status()["controller"]["trial"]["number"] == 0
        heartbeat = restarted.controller.study.heartbeat
        assert heartbeat is not None and heartbeat.beating == {0}
        restarted.abandon("the test is over")
        assert heartbeat.beating == set()


def test_a_commit_never_records_its_config_on_a_successor_of_the_same_name(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit reads the CR (its uid checked), PUTs the config to each pod, then records
    it in ``status.tunedConfig`` by name: a CR deleted and re-created meanwhile got the
    old one's tuned config, and its ConfigMap rendered from it."""
    body, policy, mint = reconciled(kube, cluster, llmd())
    handle = KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=policy,
                                  uid=body["metadata"]["uid"])
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    put = handle.admin.put

    def recreated_during(*args: Any, **kwargs: Any) -> None:
        put(*args, **kwargs)
        cluster.custom.delete_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", NS, "llmdeployments", "chat")
        cluster.create(llmd())

    monkeypatch.setattr(handle.admin, "put", recreated_during)
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        with pytest.raises(ApplyError, match="gone"):
            handle.apply_config({"token_budget": 512}, canary=False)
    assert "tunedConfig" not in cluster.status()


class BusySimulator:
    """A planner whose simulator workers all serve other deployments."""

    def search(self, *_: Any, **__: Any) -> Any:
        raise SimulatorBusy("all simulator workers busy")


def busy_planner_controller(ctx: DaemonContext) -> Controller:
    """``build_controller`` whose capacity plan never answers: a scale alert adds one
    replica on live evidence, to the count it reads plus one."""
    settings = dataclasses.replace(ctx.settings, cooldown_s=3600.0)
    return Controller(settings, ctx.handle,
                      AlertSource(ctx.spec.prometheus_url, ctx.name, namespace=ctx.namespace),
                      HoldingWindows(), FakeStudy(queue=[dict(GOOD)]), FakeProbe(),
                      BusySimulator(), state=ctx.state)


def _scaled_unrecorded(kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
                       monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A scale alert's tick scaled 1 -> 2, then its status write failed, and the
    operator stopped before it wrote it again: the status still says steady."""
    from slopilot.operator import deployment_loop

    body, _, _ = reconciled(kube, cluster, llmd(prometheus={"url": prom.url},
                                                replicas={"min": 1, "max": 8}))
    first = daemon_loop(cluster, body, monkeypatch, factory=busy_planner_controller)
    assert first.step()
    prom.fire("SlopilotTBTP99High", "scale", "chat", NS)

    def unwritten(*_: Any, **__: Any) -> Any:
        raise ApiError(500, "InternalError", "the API server went away")

    with monkeypatch.context() as m:
        m.setattr(deployment_loop, "write_status", unwritten)
        assert first.step()
    assert first.unwritten is not None and replicas(cluster) == 2
    assert cluster.status()["controller"]["state"] == "steady"
    return cluster.get()


def replicas(cluster: Cluster) -> int:
    return int(cluster.owned("apps/v1", "deployments", "chat")["spec"]["replicas"])


def test_a_scale_whose_status_write_failed_is_not_made_again_after_a_restart(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target was the count read plus one: the restarted loop, resuming the state
    from before the scale with the alert still firing, read 2 and scaled to 3. The
    scale is stamped on the Deployment over the state it was decided from, so the
    restarted loop decides from the count that state knew, and its scale to 2 is the
    same scale: it cools down."""
    body = _scaled_unrecorded(kube, cluster, prom, monkeypatch)
    restarted = daemon_loop(cluster, body, monkeypatch, factory=busy_planner_controller)
    assert restarted.step()
    status = cluster.status()
    assert replicas(cluster) == 2
    assert status["controller"]["state"] == "cooldown"
    assert status["lastAction"]["reason"].startswith("scale_up 1->2:")
    assert status["replicas"] == 2
    assert restarted.step()  # cooling down: nothing more
    assert replicas(cluster) == 2 and cluster.status()["controller"]["state"] == "cooldown"


def test_a_deployment_scaled_by_another_after_an_unrecorded_scale_is_scaled_from_there(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamp is the loop's own scale only while the Deployment still asks its count:
    scaled since by someone else, the restarted loop reads the count it finds."""
    body = _scaled_unrecorded(kube, cluster, prom, monkeypatch)
    cluster.kube.patch("apps/v1", "deployments", NS, "chat", {"spec": {"replicas": 5}})
    restarted = daemon_loop(cluster, body, monkeypatch, factory=busy_planner_controller)
    assert restarted.step()
    assert replicas(cluster) == 6
    assert cluster.status()["lastAction"]["reason"].startswith("scale_up 5->6:")


def test_an_owed_restore_the_engine_refuses_gives_way_to_the_committed_config(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An owed restore whose config this engine refuses (recorded by an older release,
    whose token_budget range was wider) was retried after each wait for ever, and no
    episode started again. Refused, it is dropped: the committed config goes to the pod,
    the decision says why, and the retune alert starts an episode at the next tick."""
    body, _, mint = reconciled(kube, cluster, llmd(prometheus={"url": prom.url},
                                                   tuning={"window": "1h"}))
    pod = PodStandIn(mint.for_body(cluster.get()), spec_config(cluster))
    older = dict(spec_config(cluster), token_budget=32768)
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "controller": {"state": "steady", "since": 0.0, "reason": "rollback_failed",
                       "baseline_config": older,
                       "pending_restore": {"since": 0.0, "attempts": 1, "retry_at": 0.0,
                                           "error": "RuntimeError: unreachable"}},
        "tunedConfig": {"engine": {"token_budget": 2048},
                        "base": engine_checksum(cluster.get())}}}, subresource="status")
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    now = [1000.0]
    loop = daemon_loop(cluster, body, monkeypatch)
    loop.clock = lambda: now[0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        assert loop.step()
        status = cluster.status()
        reason = status["lastAction"]["reason"]
        assert reason.startswith("restore_refused:"), reason
        assert "token_budget=32768" in reason and "committed config back" in reason
        assert "pending_restore" not in status["controller"]
        assert running(pod)["token_budget"] == 2048  # the committed config
        now[0] += 60.0
        assert loop.step()
        assert cluster.status()["controller"]["state"] == "tuning"
        assert cluster.status()["controller"]["trial"] is not None
