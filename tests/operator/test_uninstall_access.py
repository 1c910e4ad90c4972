"""Uninstall run by someone who may not do all of it: refused before it changes anything,
and a failure half-way reported CR by CR, for a rerun to finish.

The operator's own account may not delete LLMDeployments, nor may a tenant outside its
namespace. Run so, the command deleted the CRs it was allowed to, then stopped on the
first 403 with a traceback: those CRs stayed Terminating with the operator's finalizer
(no operator to release it), the rest untouched, nothing said about either. Without
``patch`` it deleted every CR and every study, then left each CR Terminating, "stuck"
with no reason given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.config
import pytest
import yaml

from slopilot.operator.crd import API_VERSION, PLURAL, crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.settings import FINALIZER
from slopilot.operator.uninstall import UninstallRefused, uninstall
from tests.operator.operator_support import NS, Cluster
from tests.operator.test_uninstall import names, tuned_cr
from tests.support.kube_authz import Rule, bound
from tests.support.kube_server import RunningEmulator

OTHER = "team-b"
CR_RULE = (frozenset({"slopilot.dev"}), frozenset({"llmdeployments"}))
UNINSTALLER = Path(__file__).parents[2] / "manifests" / "uninstaller-rbac.yaml"


def rule(namespace: str | None, *verbs: str) -> Rule:
    return Rule(namespace, *CR_RULE, frozenset(verbs))


def as_user(kube: RunningEmulator, tmp_path: Path, user: str, rules: list[Rule]) -> Kube:
    """A client whose calls the emulator judges by ``rules`` alone."""
    kube.emulator.restrict(f"{user}-token", user, rules)
    config = kube.kubeconfig_as(f"{user}-token", tmp_path / f"{user}.kubeconfig")
    return Kube(kubernetes.config.new_client_from_config(config_file=str(config)))


@pytest.fixture
def two_crs(kube: RunningEmulator, cluster: Cluster, tmp_path: Path
            ) -> tuple[str, OperatorPolicy]:
    """A tuned CR in each of two namespaces, its study in the storage, no operator."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    kube.install(crd_manifest())
    cluster.kube.create("v1", "namespaces", None,
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER}})
    policy = OperatorPolicy(allowed_storage=(storage,))
    tuned_cr(cluster, storage, policy)
    tuned_cr(cluster, storage, policy, namespace=OTHER)
    return storage, policy


def untouched(cluster: Cluster, *namespaces: str) -> bool:
    """Each namespace's CR is as the command found it: not deleted, finalizer on."""
    for ns in namespaces:
        body = cluster.kube.get(API_VERSION, PLURAL, ns, "chat")
        if body is None or body["metadata"].get("deletionTimestamp") \
                or FINALIZER not in body["metadata"].get("finalizers", []):
            return False
    return True


def test_a_user_who_may_not_delete_everywhere_is_refused_before_any_change(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy],
        tmp_path: Path) -> None:
    storage, policy = two_crs
    alice = as_user(kube, tmp_path, "alice", [rule(NS, "get", "list", "delete", "patch"),
                                              rule(OTHER, "get", "list", "patch")])
    with pytest.raises(UninstallRefused) as refused:
        uninstall(alice, policy, namespaces=[NS, OTHER], timeout_s=0)
    message = str(refused.value)
    assert f'delete llmdeployments.slopilot.dev in namespace "{OTHER}"' in message
    assert f'namespace "{NS}"' not in message  # allowed there: not named
    assert "nothing was changed" in message
    assert f"kubectl -n {OTHER} create rolebinding slopilot-uninstaller " \
           "--clusterrole=slopilot-uninstaller" in message
    assert untouched(cluster, NS, OTHER)
    assert len(names(storage)) == 2


def test_without_patch_no_cr_is_deleted_and_no_study(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy],
        tmp_path: Path) -> None:
    """Deleted, a CR whose finalizer this user may not release would stay Terminating."""
    storage, policy = two_crs
    bob = as_user(kube, tmp_path, "bob", [rule(None, "get", "list", "delete")])
    with pytest.raises(UninstallRefused) as refused:
        uninstall(bob, policy, namespaces=[NS, OTHER], timeout_s=0)
    assert [(m.verb, m.namespace) for m in refused.value.missing] == [
        ("patch", NS), ("patch", OTHER)]
    assert untouched(cluster, NS, OTHER)
    assert len(names(storage)) == 2


def test_all_namespaces_asks_for_each_namespace_that_holds_a_cr(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy],
        tmp_path: Path) -> None:
    """``-A`` lists cluster-wide (read only), then needs delete and patch only where a CR
    is, and names the ClusterRoleBinding that grants them all."""
    _, policy = two_crs
    carol = as_user(kube, tmp_path, "carol", [rule(None, "get", "list"),
                                              rule(NS, "delete", "patch")])
    with pytest.raises(UninstallRefused) as refused:
        uninstall(carol, policy, namespaces=None, timeout_s=0)
    assert [(m.verb, m.namespace) for m in refused.value.missing] == [
        ("delete", OTHER), ("patch", OTHER)]
    assert "kubectl create clusterrolebinding slopilot-uninstaller" in str(refused.value)
    assert untouched(cluster, NS, OTHER)

    dave = as_user(kube, tmp_path, "dave", [rule(NS, "get", "list", "delete", "patch")])
    with pytest.raises(UninstallRefused) as refused:
        uninstall(dave, policy, namespaces=None, timeout_s=0)
    assert [(m.verb, m.namespace) for m in refused.value.missing] == [("list", None)]
    assert "list llmdeployments.slopilot.dev in every namespace" in str(refused.value)
    assert untouched(cluster, NS, OTHER)


def uninstaller_role() -> dict[str, Any]:
    (role,) = [d for d in yaml.safe_load_all(UNINSTALLER.read_text(encoding="utf-8"))
               if d and d["kind"] == "ClusterRole"]
    return dict(role)


def test_the_shipped_uninstaller_role_is_enough(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy],
        tmp_path: Path) -> None:
    """Bound in one namespace, it ends that namespace's CRs (and only may); bound
    cluster-wide, every namespace's. Every call the command makes is within it (the
    emulator refuses any other with a 403, which would be in the report)."""
    storage, policy = two_crs
    role = uninstaller_role()
    assert role["metadata"]["name"] == "slopilot-uninstaller"
    erin = as_user(kube, tmp_path, "erin", bound(role, NS))
    done = uninstall(erin, policy, namespaces=[NS], timeout_s=0)
    assert done.released == [f"{NS}/chat"] and not done.stuck and not done.not_deleted
    assert untouched(cluster, OTHER)
    frank = as_user(kube, tmp_path, "frank", bound(role))
    done = uninstall(frank, policy, namespaces=None, timeout_s=0)
    assert done.released == [f"{OTHER}/chat"] and not done.stuck and not done.not_deleted
    assert names(storage) == []


def test_a_delete_that_fails_half_way_is_reported_and_a_rerun_finishes(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy]
        ) -> None:
    """The API refuses one CR's delete (an admission webhook, an overloaded server): the
    other is ended, this one is named with why, and left whole (not Terminating, not
    ended here: its finalizer and study stay, as it still serves). A rerun ends it."""
    storage, policy = two_crs
    kube.emulator.fail("DELETE", "llmdeployments", status=500)  # the first: default/chat
    done = uninstall(cluster.kube, policy, namespaces=[NS, OTHER], timeout_s=0)
    assert done.released == [f"{OTHER}/chat"]
    (line,) = done.not_deleted
    assert line.startswith(f"{NS}/chat: not deleted: 500") and "left as it was" in line
    assert untouched(cluster, NS)
    assert len(names(storage)) == 1  # its study, still in use

    again = uninstall(cluster.kube, policy, namespaces=[NS, OTHER], timeout_s=0)
    assert again.released == [f"{NS}/chat"] and not again.not_deleted
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None
    assert names(storage) == []


def test_a_release_that_fails_is_reported_with_what_was_left_and_a_rerun_finishes(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy]
        ) -> None:
    storage, policy = two_crs
    kube.emulator.fail("PATCH", "llmdeployments", status=500)  # default/chat's release
    done = uninstall(cluster.kube, policy, namespaces=[NS, OTHER], timeout_s=0)
    assert done.released == [f"{OTHER}/chat"]
    (line,) = done.stuck
    assert line.startswith(f"{NS}/chat: the finalizer {FINALIZER} was not released: 500")
    assert "left Terminating" in line
    assert names(storage) == []  # its study went before the release was tried

    again = uninstall(cluster.kube, policy, namespaces=[NS, OTHER], timeout_s=0)
    assert again.released == [f"{NS}/chat"] and not again.stuck
    assert cluster.kube.get(API_VERSION, PLURAL, NS, "chat") is None


def test_the_command_says_what_is_missing_and_changes_nothing(
        kube: RunningEmulator, cluster: Cluster, two_crs: tuple[str, OperatorPolicy],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``slopilot operator uninstall -n team-b`` as the operator's own account (its
    ClusterRole has no delete): exit 1, the fix on stderr."""
    from slopilot.cli import main

    storage, _ = two_crs
    rbac = Path(__file__).parents[2] / "manifests" / "rbac.yaml"
    (operator_role,) = [d for d in yaml.safe_load_all(rbac.read_text(encoding="utf-8"))
                        if d and d["kind"] == "ClusterRole"]
    as_user(kube, tmp_path, "operator", bound(operator_role))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "operator.kubeconfig"))
    monkeypatch.setenv("SLOPILOT_ALLOWED_STORAGE", storage)
    assert main(["operator", "uninstall", "-n", OTHER, "--timeout", "0"]) == 1
    err = capsys.readouterr().err
    assert f'delete llmdeployments.slopilot.dev in namespace "{OTHER}"' in err
    assert "you may not patch" not in err and "you may not list" not in err
    assert untouched(cluster, NS, OTHER)


def test_the_uninstaller_role_grants_what_the_command_asks_and_no_more() -> None:
    from slopilot.operator.uninstall_access import ENDING, LISTING, UNINSTALLER_ROLE

    role = uninstaller_role()
    assert role["metadata"]["name"] == UNINSTALLER_ROLE
    (only,) = role["rules"]
    assert (only["apiGroups"], only["resources"]) == (["slopilot.dev"], ["llmdeployments"])
    assert set(only["verbs"]) == {*LISTING, *ENDING}
