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

from slopilot.operator.crd import crd_manifest
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.study_cleanup import delete_studies
from tests.operator.operator_support import NS, Cluster, daemon_loop, llmd, operator_mint
from tests.operator.standins import build_study_controller
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
