"""Uninstall: no LLMDeployment stays Terminating for want of an operator, and no study of
a gone CR stays in its storage for good.

Every CR carries the operator's finalizer (kopf's, for its daemons and timers), which only
a running operator released: deleted with the operator gone, a CR, the CRD and the
namespace holding it stayed Terminating until someone stripped the finalizer by hand,
and the CR's study stayed in its storage. ``slopilot operator uninstall`` ends such a CR
as the operator would (its study deleted, its owned objects to the garbage collector),
and an operator's start reclaims the studies of CRs gone without it, by uid.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.operator.crd import API_VERSION, PLURAL, crd_manifest
from slopilot.operator.daemon import study_name
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.settings import FINALIZER
from slopilot.operator.study_cleanup import delete_studies
from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving
from slopilot.operator.uninstall import uninstall
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.study_family import successor_name
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.support.kube_server import RunningEmulator

OTHER = "team-b"


def names(storage: str) -> list[str]:
    return sorted(optuna.get_all_study_names(storage))


def tuned_cr(cluster: Cluster, storage: str, policy: OperatorPolicy, name: str = "chat",
             namespace: str = NS) -> dict[str, Any]:
    """A tuned CR as the operator leaves it: reconciled (its owned objects made), its
    finalizer on, its study in ``storage`` and on record in ``status.studyStorages``."""
    body = llmd(name, tuning={"storage": storage})
    body["metadata"]["namespace"] = namespace
    body = cluster.kube.create(API_VERSION, PLURAL, namespace, body)
    meta = body["metadata"]
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    cluster.kube.patch(API_VERSION, PLURAL, namespace, name,
                       {"metadata": {"finalizers": [FINALIZER]}})
    cluster.kube.patch(API_VERSION, PLURAL, namespace, name,
                       {"status": {"studyStorages": [storage]}}, subresource="status")
    open_study(storage, study_name(namespace, name, meta["uid"]))
    return dict(cluster.kube.get(API_VERSION, PLURAL, namespace, name) or {})


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_a_cr_deleted_with_no_operator_running_goes_with_uninstall(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    body = tuned_cr(cluster, storage, policy)
    assert cluster.owned("apps/v1", "deployments", "chat") is not None
    # Today's way round: the CR deleted with no operator stays Terminating.
    cluster.kube.request("DELETE", f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/chat")
    held = cluster.kube.get(API_VERSION, PLURAL, NS, "chat")
    assert held is not None and held["metadata"].get("deletionTimestamp")

    done = uninstall(cluster.kube, policy, namespaces=[NS], timeout_s=0)
    assert done.released == [f"{NS}/chat"] and not done.stuck and not done.studies_left
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None
    assert names(storage) == []  # its study went with it
    # Its owned objects carry its controller reference: the garbage collector took them.
    assert cluster.owned("apps/v1", "deployments", "chat") is None
    assert study_name(NS, "chat", body["metadata"]["uid"]) not in names(storage)


def test_uninstall_waits_for_a_running_operator_to_end_each_cr(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    """With an operator running, it ends each CR (its trial, its study) as ever; the
    command only waits for it, and touches neither the study nor the finalizer."""
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    tuned_cr(cluster, storage, policy)
    polls: list[float] = []

    def operator_ends_it(_seconds: float) -> None:  # the operator's finalizer, released
        polls.append(_seconds)
        cluster.kube.patch(API_VERSION, PLURAL, NS, "chat", {"metadata": {"finalizers": []}})

    done = uninstall(cluster.kube, policy, namespaces=[NS], timeout_s=60,
                     clock=lambda: 0.0, sleep=operator_ends_it)
    assert done.ended_by_operator == [f"{NS}/chat"] and done.released == []
    assert len(polls) == 1
    assert names(storage) != []  # the operator's to delete, not the command's


def test_uninstall_releases_only_the_operators_finalizer(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    tuned_cr(cluster, storage, policy)
    cluster.kube.patch(API_VERSION, PLURAL, NS, "chat",
                       {"metadata": {"finalizers": ["backup.example.com/hold", FINALIZER]}})
    done = uninstall(cluster.kube, policy, namespaces=[NS], timeout_s=0)
    assert done.released == [f"{NS}/chat"]
    left = cluster.kube.get(API_VERSION, PLURAL, NS, "chat")
    assert left is not None and left["metadata"]["finalizers"] == ["backup.example.com/hold"]


def test_uninstall_names_a_study_it_could_not_delete(
        kube: RunningEmulator, cluster: Cluster, storage: str, tmp_path: Path) -> None:
    """A storage the command's policy refuses (run outside the operator's environment)
    keeps the study, named: the operator's next start reclaims it."""
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    tuned_cr(cluster, storage, policy)
    elsewhere = OperatorPolicy(allowed_storage=(f"sqlite:///{tmp_path / 'other.db'}",))
    done = uninstall(cluster.kube, elsewhere, namespaces=[NS], timeout_s=0)
    assert done.released == [f"{NS}/chat"]
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None
    left = names(storage)
    assert len(left) == 1  # left, for the operator's next start
    assert reclaim_orphaned_studies(cluster.kube, policy, serving([NS])).deleted == left
    assert names(storage) == []


def test_orphaned_studies_are_reclaimed_by_uid_never_a_live_crs(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    """The study of a CR gone without the operator is deleted at the next start; a CR
    made again under its name (here and in another namespace) keeps its own, and studies
    the operator did not make, or of namespaces it does not serve, are left alone."""
    kube.install(crd_manifest())
    cluster.kube.create("v1", "namespaces", None,
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER}})
    policy = OperatorPolicy(allowed_storage=(storage,))
    gone = tuned_cr(cluster, storage, policy)
    cluster.kube.patch(API_VERSION, PLURAL, NS, "chat", {"metadata": {"finalizers": []}})
    cluster.kube.request("DELETE", f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/chat")
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None
    again = tuned_cr(cluster, storage, policy)  # the same name, a new uid
    there = tuned_cr(cluster, storage, policy, namespace=OTHER)  # the name elsewhere
    unserved = study_name("team-c", "chat", gone["metadata"]["uid"])
    open_study(storage, unserved)
    open_study(storage, "my-offline-tune")  # `slopilot tune`'s, named by its user
    assert len(names(storage)) == 5

    deleted = reclaim_orphaned_studies(cluster.kube, policy, serving([NS, "team-*"])).deleted
    # team-c matches team-* but holds no CR of that uid: it goes too, as served.
    assert sorted(deleted) == sorted([study_name(NS, "chat", gone["metadata"]["uid"]),
                                      unserved])
    assert names(storage) == sorted([
        study_name(NS, "chat", again["metadata"]["uid"]),
        study_name(OTHER, "chat", there["metadata"]["uid"]), "my-offline-tune"])


def test_a_namespace_not_served_or_not_listed_keeps_its_studies(
        kube: RunningEmulator, cluster: Cluster, storage: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    orphan = study_name(OTHER, "chat", "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e")
    mine = study_name(NS, "chat", "1b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e")
    open_study(storage, orphan)
    open_study(storage, mine)
    assert reclaim_orphaned_studies(cluster.kube, policy, serving([NS])).deleted == [mine]
    assert names(storage) == [orphan]

    def refused(*_a: Any, **_kw: Any) -> Any:
        raise RuntimeError("403 Forbidden")

    monkeypatch.setattr(cluster.kube, "list", refused)
    assert reclaim_orphaned_studies(cluster.kube, policy, serving(None)).deleted == []
    assert names(storage) == [orphan]


def test_the_uninstall_command_ends_a_terminating_cr(
        kube: RunningEmulator, cluster: Cluster, storage: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``slopilot operator uninstall -n NS --timeout 0``, as operations.md gives it."""
    from slopilot.cli import main

    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    tuned_cr(cluster, storage, policy)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    monkeypatch.setenv("SLOPILOT_ALLOWED_STORAGE", storage)
    assert main(["operator", "uninstall", "-n", NS, "--timeout", "0"]) == 0
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None
    assert names(storage) == []


@pytest.mark.parametrize(("patterns", "namespace", "served"), [
    (["team-*, !team-secret"], "team-a", True),
    (["team-*, !team-secret"], "team-secret", False),  # kopf's exclusion: never served
    (["!kube-*"], "default", True),  # a first exclusion implies a catch-all before it
    (["!kube-*"], "kube-system", False),
    (["team-a", "team-b"], "team-b", True),
    (["team-a"], "team-b", False),
])
def test_the_namespaces_served_are_the_ones_kopf_serves(
        patterns: list[str], namespace: str, served: bool) -> None:
    """The reclaim deletes only in namespaces the operator serves: read with fnmatch,
    kopf's '!' exclusions were literal names, and ``team-*, !team-secret`` read as
    serving team-secret, whose studies another operator's CRs may own."""
    assert serving(patterns)(namespace) is served


def families(cluster: Cluster, storage: str, policy: OperatorPolicy
             ) -> tuple[dict[str, Any], list[str], list[str]]:
    """``chat`` in NS with a successor study (a changed search space moved it: study_family),
    beside ``chat`` in OTHER and ``chat2`` in NS, each with a successor of the same space:
    the deleted CR's studies, and its neighbours'."""
    cluster.kube.create("v1", "namespaces", None,
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER}})
    mine = tuned_cr(cluster, storage, policy)
    neighbours = [tuned_cr(cluster, storage, policy, namespace=OTHER),
                  tuned_cr(cluster, storage, policy, name="chat2")]

    def family(body: dict[str, Any]) -> list[str]:
        meta = body["metadata"]
        base = study_name(meta["namespace"], meta["name"], meta["uid"])
        open_study(storage, successor_name(base, "0123456789ab"))
        return [base, successor_name(base, "0123456789ab")]

    kept = [n for b in neighbours for n in family(b)]
    return mine, family(mine), kept


def test_uninstall_deletes_every_study_of_its_crs_and_none_of_another_namespaces(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    _mine, gone, kept = families(cluster, storage, policy)
    assert names(storage) == sorted(gone + kept)
    # Uninstalled from NS: chat and chat2 end, each with its own family; OTHER's chat,
    # of the same name and a successor of the same space, keeps both of its studies.
    done = uninstall(cluster.kube, policy, namespaces=[NS], timeout_s=0)
    assert sorted(done.released) == [f"{NS}/chat", f"{NS}/chat2"]
    assert not done.studies_left
    assert names(storage) == sorted(n for n in kept if n.startswith(f"{OTHER}/"))


def test_the_deleted_crs_cleanup_deletes_its_base_and_successor_only(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    mine, _gone, kept = families(cluster, storage, policy)
    delete_studies(mine, policy, log=logging.getLogger("test"))
    assert names(storage) == sorted(kept)


def test_an_orphans_successor_is_reclaimed_and_a_live_crs_kept(
        kube: RunningEmulator, cluster: Cluster, storage: str) -> None:
    kube.install(crd_manifest())
    policy = OperatorPolicy(allowed_storage=(storage,))
    _mine, gone, kept = families(cluster, storage, policy)
    cluster.kube.patch(API_VERSION, PLURAL, NS, "chat", {"metadata": {"finalizers": []}})
    cluster.kube.request("DELETE", f"/apis/{API_VERSION}/namespaces/{NS}/{PLURAL}/chat")
    deleted = reclaim_orphaned_studies(cluster.kube, policy, serving([NS, OTHER])).deleted
    assert sorted(deleted) == sorted(gone)
    assert names(storage) == sorted(kept)
