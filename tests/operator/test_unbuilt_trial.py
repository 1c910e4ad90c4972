"""A trial is not left serving while no controller can be built, nor judged afterwards.

The daemon keeps the pods on the trial on record only while a controller watches it.
Where none can be built (the study's storage unreadable after a restart, the spec or the
operator's policy refusing the CR), the trial is ended in the loop state: its config
leaves the pods (the committed one back), it is told failed in its own study once a
controller is built again, and never judged on a window that watched nothing. A switch of
the study's storage mid-trial ends the episode as a backend switch does: the trial told
failed in the old storage's study, no cooldown, the next episode in the new storage
(deployment_loop.py, trial_ends.py)."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from slopilot.operator.crd import GROUP, PLURAL, VERSION
from slopilot.operator.daemon import DaemonContext
from slopilot.operator.deployment_loop import DeploymentLoop
from slopilot.operator.policy import OperatorPolicy
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.study.storage import StudyStorageError
from tests.operator.operator_support import NS, Cluster, add_pod, daemon_loop
from tests.operator.standins import PodStandIn, PrometheusStandIn, build_study_controller, serving
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.operator.test_live_config import running, spec_config
from tests.support.kube_server import RunningEmulator

HOUR_S = 3600.0


def _as_operator(ctx: DaemonContext) -> Controller:
    """``build_study_controller``, a storage it cannot open said as the production
    factory says it (``daemon.prometheus_controller``)."""
    try:
        return build_study_controller(ctx)
    except StudyStorageError as exc:
        raise ControllerError(f"spec.tuning.storage: {exc}") from None


def _on_clock(cluster: Cluster, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
              policy: OperatorPolicy, now: list[float]) -> DeploymentLoop:
    """The CR's daemon loop as the operator builds it, on the test's clock ``now[0]``."""
    loop = daemon_loop(cluster, body, monkeypatch, factory=_as_operator, policy=policy)
    loop.clock = lambda: now[0]
    return loop


def _trials(body: dict[str, Any], storage: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=f"{NS}/chat/{body['metadata']['uid']}",
                             storage=storage).trials


def _tuning_condition(cluster: Cluster) -> dict[str, Any]:
    return next(c for c in cluster.status()["conditions"] if c["type"] == "Tuning")


def _trial_on_pod(cluster: Cluster, pod: PodStandIn, spec: dict[str, Any]
                  ) -> dict[str, Any]:
    """The trial the first step started, after checking it runs on the pod and its
    config differs from ``spec`` (the spec's, before any trial was recorded)."""
    trial = cluster.status()["controller"]["trial"]
    assert trial is not None and trial["number"] == 0
    assert running(pod)["max_num_seqs"] == trial["config"]["max_num_seqs"] \
        != spec["max_num_seqs"]
    return dict(trial)


def test_a_trial_whose_study_cannot_be_opened_after_a_restart_leaves_the_pods(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage, db = policy.allowed_storage[0], tmp_path / "study.db"
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert first.step()
        _trial_on_pod(cluster, pod, before)
        first.close()  # the operator stops; its storage is unreadable as it starts again
        shutil.move(db, tmp_path / "saved.db")
        db.write_bytes(b"not a database" * 100)
        second = _on_clock(cluster, body, monkeypatch, policy, now)
        now[0] += 60.0
        assert second.step()
        assert second.controller is None
        assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
        saved = cluster.status()["controller"]
        assert saved.get("trial") is None and saved["ended_trial"]["number"] == 0
        condition = _tuning_condition(cluster)
        assert condition["reason"] == "ControllerUnavailable"
        assert "trial 0" in condition["message"] and "not a database" in condition["message"]
        shutil.move(tmp_path / "saved.db", db)  # the storage is back
        for _ in range(3):
            now[0] += 2 * HOUR_S
            assert second.step()
            assert "trial 0 holds" not in cluster.status()["controller"]["reason"]
    trial = _trials(body, storage)[0]
    assert trial.state is TrialState.FAIL
    assert "no controller" in trial.user_attrs["fail_reason"]
    assert cluster.status()["controller"].get("ended_trial") is None


def test_a_trial_under_a_policy_that_refuses_its_storage_is_not_judged_later(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert first.step()
        _trial_on_pod(cluster, pod, before)
        first.close()
        # The administrator restarts the operator with an allow-list without the CR's.
        tighter = OperatorPolicy(allowed_storage=(f"sqlite:///{tmp_path / 'central.db'}",))
        second = _on_clock(cluster, body, monkeypatch, tighter, now)
        now[0] += 60.0
        assert second.step()
        assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
        assert cluster.status()["controller"].get("trial") is None
        assert "trial 0" in _tuning_condition(cluster)["message"]
        second.close()
        third = _on_clock(cluster, body, monkeypatch, policy, now)
        for _ in range(3):  # allowed again: the trial is told failed, never committed
            now[0] += 2 * HOUR_S
            assert third.step()
            assert "trial 0 holds" not in cluster.status()["controller"]["reason"]
    assert _trials(body, storage)[0].state is TrialState.FAIL


def test_a_bounds_edit_the_operator_refuses_mid_trial_takes_the_trial_off_the_pods(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        loop = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert loop.step()
        value = _trial_on_pod(cluster, pod, before)["config"]["max_num_seqs"]
        # Bounds that hold the trial's value and not the spec's knob: the spec is refused.
        cluster.patch("chat", {"spec": {"tuning": {"bounds": {
            "maxNumSeqs": {"min": value - 20, "max": value + 20}}}}})
        now[0] += 60.0
        assert loop.step()
        assert loop.controller is None
        assert _tuning_condition(cluster)["reason"] == "ControllerUnavailable"
        # The config the deployment ran before the trial (the episode's starting one).
        assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
        assert cluster.status()["controller"].get("trial") is None
        cluster.patch("chat", {"spec": {"tuning": {"bounds": None}}})  # fixed
        for _ in range(2):
            now[0] += 2 * HOUR_S
            assert loop.step()
            assert "trial 0 holds" not in cluster.status()["controller"]["reason"]
    assert _trials(body, storage)[0].state is TrialState.FAIL


def test_a_storage_switch_mid_trial_ends_the_episode_without_a_cooldown(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    old, new = policy.allowed_storage[0], f"sqlite:///{tmp_path / 'other.db'}"
    policy = OperatorPolicy(allowed_storage=(old, new))
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        loop = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert loop.step()
        _trial_on_pod(cluster, pod, before)
        cluster.patch("chat", {"spec": {"tuning": {"storage": new}}})
        now[0] += 60.0
        assert loop.step()
        failed = _trials(body, old)[0]
        assert failed.state is TrialState.FAIL
        assert failed.user_attrs["fail_reason"].startswith("storage_switched")
        # The alert still fires: the next episode began in the new storage, no cooldown.
        saved = cluster.status()["controller"]
        assert saved["state"] == "tuning" and saved["trial"]["number"] == 0
        assert "error" not in _tuning_condition(cluster)["message"]
        assert running(pod)["max_num_seqs"] == saved["trial"]["config"]["max_num_seqs"]
    assert [t.state for t in _trials(body, new)] == [TrialState.RUNNING]



def test_a_backend_and_storage_switch_in_one_edit_fails_the_trial_in_the_old_storage(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The engine switch ends the episode first, so the storage switch finds nothing to
    end: the trial it hands on was told failed in the new storage, where it never was,
    and stayed RUNNING in the old one."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    old, new = policy.allowed_storage[0], f"sqlite:///{tmp_path / 'other.db'}"
    policy = OperatorPolicy(allowed_storage=(old, new))
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        loop = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert loop.step()
        _trial_on_pod(cluster, pod, before)
        cluster.patch("chat", {"spec": {"backend": "vllm", "tuning": {"storage": new}}})
        now[0] += 60.0
        assert loop.step()
    failed = _trials(body, old)[0]
    assert failed.state is TrialState.FAIL
    assert failed.user_attrs["fail_reason"].startswith("engine_switched")
    assert cluster.status()["controller"].get("ended_trial") is None


def test_an_ended_trial_on_record_naming_the_running_trial_is_not_told_failed(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``status.controller.ended_trial`` is writable by whoever may patch the status: one
    naming the trial still on record failed it in its study, and the controller then
    committed that same trial (the study and the committed config disagreed)."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    storage = policy.allowed_storage[0]
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = daemon_loop(cluster, body, monkeypatch, factory=_as_operator, policy=policy)
        assert first.step()
        trial = cluster.status()["controller"]["trial"]
        first.close()
        cluster.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, PLURAL, "chat", {"status": {"controller": {"ended_trial": {
                "number": trial["number"], "reason": "forged", "study": trial["study"]}}}})
        second = _on_clock(cluster, body, monkeypatch, policy, now)
        assert second.step()
        assert cluster.status()["controller"].get("ended_trial") is None
        now[0] += 2 * HOUR_S
        assert second.step()
        assert cluster.status()["controller"]["reason"].startswith("commit: trial 0")
    assert _trials(body, storage)[0].state is TrialState.COMPLETE


def test_a_refused_edit_that_also_switches_the_backend_takes_the_trial_off_the_pods(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The refused spec names vLLM, and the reconcile applies nothing of it: the pods
    still run the built-in engine, the trial's config among them. Read from the refused
    spec, the backend said there was nothing to take back, while the status said the
    trial's config was taken off the pods."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        loop = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert loop.step()
        value = _trial_on_pod(cluster, pod, before)["config"]["max_num_seqs"]
        cluster.patch("chat", {"spec": {"backend": "vllm", "tuning": {"bounds": {
            "maxNumSeqs": {"min": value - 20, "max": value + 20}}}}})
        for _ in range(3):  # later steps rewrite the condition: the trial's end stays said
            now[0] += 600.0
            assert loop.step()
            assert loop.controller is None
            assert running(pod)["max_num_seqs"] == before["max_num_seqs"]
            message = _tuning_condition(cluster)["message"]
            assert "maxNumSeqs" in message and "trial 0 ended" in message
