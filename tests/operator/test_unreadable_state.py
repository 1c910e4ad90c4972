"""A loop state this operator cannot read leaves no trial serving unwatched.

``status.controller`` may hold what another slopilot wrote: a downgrade meets a newer
operator's field, an upgrade an older one's, and a hand edit anything. No controller is
built from it (the ``Tuning`` condition says why, and how to reset it), and, as where
the study's storage is unreadable (test_unbuilt_trial.py), the pods do not go on
serving the trial it records: the committed config goes back on them
(``status.tunedConfig.committed``) while the state cannot be read. A field an older
slopilot wrote and a later one removed is dropped rather than refused
(``LoopState``'s ``REMOVED_FIELDS``)."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.crd import GROUP, PLURAL, VERSION, crd_manifest
from tests.operator.operator_support import NS, Cluster, add_pod
from tests.operator.standins import PrometheusStandIn, serving
from tests.operator.test_daemon_heartbeat import tuning_cr
from tests.operator.test_live_config import running, spec_config
from tests.operator.test_unbuilt_trial import HOUR_S, _on_clock, _trial_on_pod, _tuning_condition
from tests.support.kube_server import RunningEmulator


def _crd_with_rollout_field(cluster: Cluster, name: str, schema: dict[str, Any]) -> None:
    """This CRD with ``status.controller.rollout.<name>`` declared, as the CRD of the
    slopilot that writes it declares it (the API server keeps it in the status)."""
    versions = copy.deepcopy(crd_manifest()["spec"]["versions"])
    rollout = versions[0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"]["controller"]["properties"]["rollout"]
    rollout["properties"][name] = schema
    cluster.kube.patch("apiextensions.k8s.io/v1", "customresourcedefinitions", None,
                       f"{PLURAL}.{GROUP}", {"spec": {"versions": versions}})


def _patch_controller(cluster: Cluster, controller: dict[str, Any] | None) -> None:
    cluster.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "chat", {"status": {"controller": controller}})


def test_a_state_a_newer_slopilot_wrote_puts_the_committed_config_back_on_the_pods(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = _on_clock(cluster, body, monkeypatch, policy, now)
        assert first.step()
        now[0] += 2 * HOUR_S  # trial 0 committed; the alert still fires: trial 1
        assert first.step()
        assert cluster.status()["controller"]["reason"].startswith("commit: trial 0")
        committed = cluster.status()["tunedConfig"]["engine"]["max_num_seqs"]
        for _ in range(12):  # past the commit's cooldown
            if (cluster.status()["controller"].get("trial") or {}).get("number") == 1:
                break
            now[0] += 600.0
            assert first.step()
        trial = cluster.status()["controller"]["trial"]["config"]["max_num_seqs"]
        assert running(pod)["max_num_seqs"] == trial != committed
        tuned = cluster.status()["tunedConfig"]
        assert tuned["trial"] is True and tuned["committed"]["max_num_seqs"] == committed
        first.close()
        # A newer operator watched a rollout and wrote a field this one does not know;
        # then this one is rolled back in (a downgrade, its CRD left as the newer one's).
        _crd_with_rollout_field(cluster, "phase", {"type": "string"})
        _patch_controller(cluster, {"rollout": {"since": now[0], "phase": "surge"}})
        assert cluster.status()["controller"]["rollout"]["phase"] == "surge"
        second = _on_clock(cluster, body, monkeypatch, policy, now)
        for _ in range(3):  # at once, and still hours later
            now[0] += 60.0
            assert second.step()
            assert second.controller is None
            assert running(pod)["max_num_seqs"] == committed
            tuned = cluster.status()["tunedConfig"]
            assert tuned.get("trial") is not True and tuned["engine"]["max_num_seqs"] == committed
            condition = _tuning_condition(cluster)
            assert condition["reason"] == "ControllerUnavailable"
            message = condition["message"]
            assert "rollout.phase" in message and "newer" in message
            assert "unexpected keyword" not in message
            assert "committed config" in message and "controller\":null" in message
            now[0] += HOUR_S
        _patch_controller(cluster, None)  # the condition's fix: the loop starts afresh
        now[0] += 60.0
        assert second.step()
        assert second.controller is not None
        assert cluster.status()["controller"]["state"] in ("steady", "tuning")
        second.close()


def test_a_state_an_older_slopilot_wrote_mid_rollout_is_resumed(
        kube: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The builds of 2026-12-06 from 16de31b3 until a5dc8754 kept ``rollout.progress``,
    and their CRD kept it in the status: upgraded from one mid-trial, the controller
    resumes the trial, the field dropped, rather than stopping with the trial's config
    left serving."""
    body, policy, pod = tuning_cr(kube, cluster, prom, tmp_path)
    now = [1_000_000.0]
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        first = _on_clock(cluster, body, monkeypatch, policy, now)
        before = spec_config(cluster)
        assert first.step()
        trial = _trial_on_pod(cluster, pod, before)
        first.close()
        _crd_with_rollout_field(cluster, "progress", {"type": "string", "nullable": True})
        _patch_controller(cluster, {"rollout": {"since": now[0], "progress": "1/1 updated"}})
        second = _on_clock(cluster, body, monkeypatch, policy, now)
        now[0] += 60.0
        assert second.step()
        assert second.controller is not None
        assert _tuning_condition(cluster)["reason"] != "ControllerUnavailable"
        saved = cluster.status()["controller"]
        assert saved["trial"]["number"] == trial["number"]
        assert "progress" not in (saved.get("rollout") or {})
        second.close()
