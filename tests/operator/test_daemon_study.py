"""A deleted CR's study leaves the storage, also when the daemon that ends built none,
from every storage it lived in (``status.studyStorages``), tuning on or off.

A daemon whose CR is deleted before its first step (a restarted operator's, say) ends
before a step built the controller whose study it deletes: it builds one from the CR's
body.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import kubernetes.client
import optuna
import pytest
from optuna.trial import TrialState

from slopilot.operator.crd import API_VERSION, crd_manifest
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.study_cleanup import delete_studies
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.study_family import successor_name
from tests.operator.operator_support import (
    GROUP,
    NS,
    PLURAL,
    VERSION,
    Cluster,
    daemon_loop,
    llmd,
    operator,
    operator_mint,
    pods_up,
    wait_for,
)
from tests.operator.standins import (
    PodStandIn,
    PrometheusStandIn,
    build_study_controller,
    serving,
)
from tests.operator.test_live_config import spec_config
from tests.support.kube_server import RunningEmulator


def study_names(storage: str) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage)]


def test_a_daemon_that_built_no_controller_still_deletes_its_crs_study(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    body = cluster.create(llmd(prometheus={"url": "http://127.0.0.1:9"},
                               tuning={"storage": storage}))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    first = daemon_loop(cluster, cluster.get(), monkeypatch,
                        factory=build_study_controller, policy=policy)
    assert first.step() is True and first.controller is not None
    name = f"{NS}/chat/{body['metadata']['uid']}"
    assert study_names(storage) == [name]

    restarted = daemon_loop(cluster, cluster.get(), monkeypatch,
                            factory=build_study_controller, policy=policy)
    assert restarted.controller is None
    restarted.end_deleted()
    assert study_names(storage) == []


def test_a_deleted_crs_daemon_deletes_its_base_study_and_its_successor_only(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The controller tunes in the successor a changed search space moved it to; the
    daemon's end deletes that and the base it moved on from, and no neighbour's study
    (the same name in another namespace, a name it is a prefix of)."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    policy = OperatorPolicy(allowed_storage=(storage,))
    body = cluster.create(llmd(prometheus={"url": "http://127.0.0.1:9"},
                               tuning={"storage": storage}))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    base = f"{NS}/chat/{body['metadata']['uid']}"
    older = ResumableTuner(open_study(storage, base),
                           SearchSpace.from_bounds({"preemption_mode": ["recompute"]}))
    older.tell_failed(older.ask()[0], "an older release's trial")
    older.close()
    neighbours = [f"team-b/chat/{body['metadata']['uid']}", f"{NS}/chat2/u2",
                  successor_name(f"{NS}/chat2/u2", "0123456789ab")]
    for name in neighbours:
        open_study(storage, name)
    loop = daemon_loop(cluster, cluster.get(), monkeypatch,
                       factory=build_study_controller, policy=policy)
    assert loop.step() is True and loop.controller is not None
    tuning_in = loop.controller.study.study.study_name  # type: ignore[attr-defined]
    assert tuning_in.startswith(base + "/space-")
    assert sorted(study_names(storage)) == sorted([base, tuning_in, *neighbours])
    loop.end_deleted()
    assert sorted(study_names(storage)) == sorted(neighbours)


def _switched(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
              monkeypatch: pytest.MonkeyPatch, tmp_path: Path
              ) -> tuple[Cluster, Any, OperatorPolicy, list[str], str]:
    """A CR whose study lived in A, then (``spec.tuning.storage`` switched) in B."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    a, b = (f"sqlite:///{tmp_path / f}" for f in ("a.db", "b.db"))
    policy = OperatorPolicy(allowed_storage=(a, b))
    body = cluster.create(llmd(prometheus={"url": "http://127.0.0.1:9"},
                               tuning={"storage": a}))
    mint = operator_mint(cluster)
    assert reconcile(cluster.kube, body, policy=policy, mint=mint).valid
    loop = daemon_loop(cluster, cluster.get(), monkeypatch, factory=build_study_controller,
                       policy=policy)
    assert loop.step() is True
    cluster.patch("chat", {"spec": {"tuning": {"storage": b}}})
    assert reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint).valid
    assert loop.step() is True
    name = f"{NS}/chat/{body['metadata']['uid']}"
    assert study_names(a) == [name] and study_names(b) == [name]
    # Each storage is on record as the daemon opens the study there.
    assert cluster.get()["status"]["studyStorages"] == [a, b]
    return cluster, loop, policy, [a, b], name


def test_a_study_moved_to_another_storage_leaves_both_when_the_cr_is_deleted(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _, loop, _, (a, b), _ = _switched(kube, kube_client, monkeypatch, tmp_path)
    loop.end_deleted()  # the daemon's end when the CR is deleted
    assert study_names(a) == [] and study_names(b) == []


def test_tuning_turned_off_then_the_cr_deleted_leaves_no_study(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The documented route: no daemon runs while tuning is off, so the deletion handler
    deletes the study from every storage on record."""
    cluster, loop, policy, (a, b), _ = _switched(kube, kube_client, monkeypatch, tmp_path)
    loop.abandon("tuning was disabled", restore=True)
    loop.close()
    cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
    delete_studies(cluster.get(), policy, log=logging.getLogger("test"))
    assert study_names(a) == [] and study_names(b) == []


def test_a_storage_on_record_that_the_policy_refuses_is_never_opened(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The status is whoever may write it: an entry the policy does not allow (another
    team's database, a path outside the allowed ones, a password) is left alone."""
    cluster, loop, _, (a, b), name = _switched(kube, kube_client, monkeypatch, tmp_path)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(storage=other, study_name=name)
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {"status": {
        "studyStorages": [other, "postgresql://u:secret@db/x", "sqlite:///rel.db", a]}},
        subresource="status")
    loop.end_deleted()
    assert study_names(other) == [name]
    assert study_names(a) == [] and study_names(b) == []
    assert not (Path.cwd() / "rel.db").exists()


def test_a_cr_deleted_while_no_operator_runs_has_its_study_deleted_at_the_next_start(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The daemon's end deletes a deleted CR's study, but kopf starts no daemon for a CR
    already Terminating: deleted while the operator was down, mid-trial, the CR was let
    go at the next start and its study, the trial still RUNNING, stayed in the shared
    storage (the reclaim at that start counted the Terminating CR as live). The deletion
    handler deletes it, before the finalizer goes."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY",
                       "tests.operator.standins:build_study_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.2")
    monkeypatch.setenv("SLOPILOT_ALLOWED_STORAGE", storage)
    prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
    pod = PodStandIn()
    with serving(pod), operator(kube_login):
        body = cluster.create(llmd(prometheus={"url": prom.url},
                                   tuning={"window": "1h", "storage": storage}))
        pods_up(cluster, [pod], config=lambda: spec_config(cluster))
        wait_for(lambda: (cluster.status().get("controller") or {}).get("trial"),
                 what="a trial running")
    name = f"{NS}/chat/{body['metadata']['uid']}"
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert [t.state for t in trials] == [TrialState.RUNNING]
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "chat")
    assert cluster.get()["metadata"].get("deletionTimestamp")  # held by the finalizer

    with operator(kube_login):
        wait_for(lambda: cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None,
                 what="the CR gone")
        assert study_names(storage) == []
