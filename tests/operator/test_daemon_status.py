"""The controller daemon's status: conditions that stay, writes that are idempotent, SLO
figures each window, nothing of a foreign answer reflected, a deleted CR's study deleted
and a CR that turns tuning off keeping its own."""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None until they appear.
# mypy: disable-error-code="attr-defined,index,union-attr,arg-type"

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.operator.operator_support import (
    NS,
    Cluster,
    llmd,
    operator,
    pods_up,
    wait_for,
    wait_steady,
)
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.support.kube_server import RunningEmulator

SECRET = "TOP-SECRET-5e1b"


def types(cluster: Cluster, name: str = "chat") -> set[str]:
    return {c["type"] for c in cluster.status(name).get("conditions") or ()}


def daemon_writes(kube: RunningEmulator) -> int:
    return sum(1 for r in list(kube.emulator._requests)
               if r.method.value == "PATCH" and r.subresource == "status"
               and r.resource is not None and r.resource.plural == "llmdeployments")


def test_the_daemon_never_erases_the_reconcile_handlers_conditions(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    with operator(kube_login):
        cluster.create(llmd(prometheus={"url": prom.url}))
        wait_for(lambda: {"Valid", "Reconciled", "AdminToken", "Tuning"} <= types(cluster),
                 what="both writers' conditions side by side")
        # Many daemon ticks later (each one a status write), they are all still there.
        seen = daemon_writes(kube_login)
        wait_for(lambda: daemon_writes(kube_login) >= seen + 10, what="ten more writes")
        assert {"Valid", "Reconciled", "AdminToken", "Tuning"} <= types(cluster)
        # And a reconcile after a spec change leaves the daemon's Tuning in place.
        cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 2048}}})
        wait_for(lambda: (cluster.status().get("config") or {}).get("tokenBudget") == 2048,
                 what="the edit reconciled")
        assert {"Valid", "Reconciled", "AdminToken", "Tuning"} <= types(cluster)


def test_the_measured_slo_figures_reach_status_each_window(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    with operator(kube_login):
        cluster.create(llmd(prometheus={"url": prom.url}, tuning={"window": "1s"}))
        status = wait_for(lambda: (s := cluster.status()).get("measuredAt") and s,
                          what="a window's figures in status")
        # standins.HOLDS: the worst class's P99s, and 150 of 160 tokens/s within the SLO.
        assert status["ttftP99Ms"] == 300.0 and status["tbtP99Ms"] == 50.0
        assert status["sloAttainment"] == pytest.approx(150 / 160, abs=1e-4)
        first = status["measuredAt"]
        wait_for(lambda: cluster.status()["measuredAt"] != first, what="the next window")


def test_a_failed_status_write_does_not_make_the_daemon_ask_a_second_trial(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    pods = [PodStandIn(), PodStandIn()]
    with serving(*pods), operator(kube_login):
        cluster.create(llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                            tuning={"window": "1h", "canary": True}))
        pods_up(cluster, pods)
        wait_steady(cluster)
        # The write that would record the first trial fails (and twice more after it).
        kube_login.emulator.fail("PATCH", "llmdeployments", subresource="status", times=3)
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        trial = wait_for(lambda: (cluster.status().get("controller") or {}).get("trial"),
                         what="the trial on record")
        seen = daemon_writes(kube_login)
        wait_for(lambda: daemon_writes(kube_login) >= seen + 5, what="more ticks")
        assert trial["number"] == 0 and cluster.status()["controller"]["trial"]["number"] == 0
        assert len(pods[0].puts) == 1, pods[0].put_bodies()  # one trial, applied once
        assert trial["canary_replica"] == "chat-pod-0"
        # kopf posts events from a queue of its own: wait for the first, then count.
        wait_for(lambda: cluster.events("Trial"), what="the Trial event")
        assert len(cluster.events("Trial")) == 1


@pytest.fixture
def study_storage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Controllers on a real study (``build_study_controller``) in a SQLite file the
    administrator lists."""
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY",
                       "tests.operator.standins:build_study_controller")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    monkeypatch.setenv("SLOPILOT_ALLOWED_STORAGE", storage)
    return storage


def running_trial(cluster: Cluster, prom: PrometheusStandIn, storage: str) -> dict[str, Any]:
    """A vLLM chat tuning on ``storage``, with a trial started by a retune alert."""
    body = cluster.create(llmd(backend="vllm", prometheus={"url": prom.url},
                               tuning={"window": "1h", "storage": storage}))
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    wait_for(lambda: (cluster.status().get("controller") or {}).get("trial"),
             what="a running trial")
    return body


def study_trials(storage: str) -> dict[str, list[TrialState]]:
    return {s.study_name: [t.state for t in optuna.load_study(
        study_name=s.study_name, storage=storage).get_trials(deepcopy=False)]
        for s in optuna.get_all_study_summaries(storage)}


def test_a_cr_deleted_mid_trial_takes_its_study_along_and_its_successor_starts_afresh(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, study_storage: str) -> None:
    storage = study_storage
    with operator(kube_login):
        first = running_trial(cluster, prom, storage)
        name = f"{NS}/chat/{first['metadata']['uid']}"
        assert study_trials(storage) == {name: [TrialState.RUNNING]}
        cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                       "llmdeployments", "chat")
        wait_for(lambda: not cluster.custom.list_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", NS, "llmdeployments")["items"], what="the CR gone")
        # Its study is deleted with it: no later CR can resume it (the name holds the
        # CR's uid), and kept it would grow the shared storage by every deleted CR.
        assert study_trials(storage) == {}

        # The same name again: another deployment, its own study, no trial inherited.
        prom.alerts = []
        second = cluster.create(llmd(backend="vllm", prometheus={"url": prom.url},
                                     tuning={"window": "1h", "storage": storage}))
        wait_steady(cluster, "the new CR's controller")
        assert cluster.status()["controller"].get("trial") is None
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        wait_for(lambda: (cluster.status().get("controller") or {}).get("trial"),
                 what="the new CR's own trial")
        again = f"{NS}/chat/{second['metadata']['uid']}"
        assert again != name and study_trials(storage) == {again: [TrialState.RUNNING]}


def trial_then_tuning_off(cluster: Cluster, prom: PrometheusStandIn, storage: str) -> str:
    """A trial under way, then tuning turned off: the study's name, its one trial failed."""
    body = running_trial(cluster, prom, storage)
    name = f"{NS}/chat/{body['metadata']['uid']}"
    cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
    # The daemon's end fails the trial, then clears it from status: it has ended then.
    wait_for(lambda: study_trials(storage) == {name: [TrialState.FAIL]}
             and not (cluster.status().get("controller") or {}).get("trial"),
             what="the stopped daemon to fail its trial and record it")
    return name


def test_a_cr_that_turns_tuning_off_keeps_its_study_to_continue_it(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, study_storage: str) -> None:
    storage = study_storage
    with operator(kube_login):
        name = trial_then_tuning_off(cluster, prom, storage)
        assert study_trials(storage) == {name: [TrialState.FAIL]}
        failed = optuna.load_study(study_name=name, storage=storage).trials[0]
        assert "tuning was disabled" in failed.user_attrs["fail_reason"]

        cluster.patch("chat", {"spec": {"tuning": {"enabled": True}}})
        wait_for(lambda: len(study_trials(storage).get(name, ())) == 2,
                 what="tuning on again to continue the same study")
        assert study_trials(storage) == {name: [TrialState.FAIL, TrialState.RUNNING]}


def test_a_cr_deleted_while_tuning_is_off_takes_its_study_along(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, study_storage: str) -> None:
    """No daemon runs to end with it: the deletion handler deletes the study, on the
    operator's tuning pool."""
    storage = study_storage
    with operator(kube_login):
        trial_then_tuning_off(cluster, prom, storage)
        cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                       "llmdeployments", "chat")
        wait_for(lambda: not cluster.custom.list_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", NS, "llmdeployments")["items"], what="the CR gone")
        wait_for(lambda: study_trials(storage) == {}, what="its study deleted")


def test_two_namespaces_chat_are_two_deployments_to_the_operator(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, study_storage: str) -> None:
    storage = study_storage
    body = llmd(backend="vllm", prometheus={"url": prom.url},
                tuning={"window": "1h", "storage": storage})
    with operator(kube_login):
        uids = {}
        for ns in ("team-a", "team-b"):
            created = cluster.custom.create_namespaced_custom_object(
                "slopilot.dev", "v1alpha1", ns, "llmdeployments",
                {**body, "metadata": {"name": "chat", "namespace": ns}})
            uids[ns] = created["metadata"]["uid"]
        prom.fire("SlopilotTTFTP99High", "retune", "chat", "team-a", "team-b")

        def trial(ns: str) -> Any:
            got = cluster.custom.get_namespaced_custom_object(
                "slopilot.dev", "v1alpha1", ns, "llmdeployments", "chat")
            return ((got.get("status") or {}).get("controller") or {}).get("trial")

        for ns in uids:
            wait_for(lambda n=ns: trial(n), what=f"{ns}'s trial")
        # One study each, under namespace/name/uid, each with its own running trial.
        assert study_trials(storage) == {f"{ns}/chat/{uid}": [TrialState.RUNNING]
                                         for ns, uid in uids.items()}
        for ns in uids:
            assert cluster.kube.get("apps/v1", "deployments", ns, "chat") is not None

        # Deleting team-a's chat deletes its study only: team-b's, of the same name, stays.
        cluster.custom.delete_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", "team-a", "llmdeployments", "chat")
        wait_for(lambda: not cluster.custom.list_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", "team-a", "llmdeployments")["items"],
            what="team-a's CR gone")
        assert study_trials(storage) == {f"team-b/chat/{uids['team-b']}": [TrialState.RUNNING]}


def test_a_foreign_answer_never_reaches_status_or_events(
        kube_login: RunningEmulator, cluster: Cluster, controller_env: None) -> None:
    leaky = PrometheusStandIn()
    leaky.raw_answer = (200, "application/json", json.dumps({"token": SECRET}).encode())
    with serving(leaky), operator(kube_login):
        cluster.create(llmd(prometheus={"url": leaky.url}))
        tuning = wait_for(lambda: (c := cluster.condition("Tuning")) and "HTTP 200" in c[
            "message"] and c, what="the hold, with the status code")
        assert "application/json" in tuning["message"]
        wait_for(lambda: cluster.events("Hold"), what="the Hold event")
        text = json.dumps(cluster.get()) + json.dumps(
            [e.message for e in cluster.core.list_namespaced_event(NS).items])
        assert SECRET not in text


def test_the_operator_refuses_what_its_policy_does_not_allow(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOPILOT_ALLOWED_PROMETHEUS", "prometheus-operated.monitoring:9090")
    with operator(kube_login):
        cluster.create(llmd("far", prometheus={"url": prom.url}))
        cluster.create(llmd("odd", image="docker.io/someone/miner:1"))
        for name, field in (("far", "spec.prometheus.url"), ("odd", "spec.image")):
            valid = wait_for(lambda n=name: cluster.condition("Valid", n), what="Valid")
            assert valid["status"] == "False" and valid["reason"] == "NotAllowed"
            assert valid["message"].startswith(field), valid["message"]
            assert cluster.owned("apps/v1", "deployments", name) is None
        # The controller never fetched the refused URL.
        wait_for(lambda: (c := cluster.condition("Tuning", "far")) and c["reason"]
                 == "ControllerUnavailable", what="the controller refusing too")
        assert prom.requests == 0
