"""A deleted CR's study leaves the storage, also when the daemon that ends built none.

A daemon whose CR is deleted before its first step (a restarted operator's, say) ends
before a step built the controller whose study it deletes: it builds one from the CR's
body.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes.client
import optuna
import pytest

from slopilot.operator.crd import crd_manifest
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
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
