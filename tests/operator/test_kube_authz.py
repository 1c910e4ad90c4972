"""The emulator's RBAC as an API server applies it: bindings, and the owner-reference
admission plugin (OwnerReferencesPermissionEnforcement)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.config
import pytest

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import ApiError, Kube
from tests.support.kube_authz import Attributes, allows, granted_to, owner_reference_checks
from tests.support.kube_server import RunningEmulator

SA = {"kind": "ServiceAccount", "name": "op", "namespace": "ops"}
READ_CMS = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
LIST_NS = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}


def role(kind: str, name: str, *rules: dict[str, Any], namespace: str | None = None
         ) -> dict[str, Any]:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "rules": list(rules)}


def binding(kind: str, role_kind: str, name: str, namespace: str | None = None,
            subject: dict[str, str] = SA) -> dict[str, Any]:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": name},
            "subjects": [subject]}


def get_cm(namespace: str) -> Attributes:
    return Attributes(namespace, "", "configmaps", "get", "x")


def test_a_cluster_role_reaches_where_it_is_bound_and_a_role_its_namespace_only() -> None:
    wide = granted_to([role("ClusterRole", "r", READ_CMS, LIST_NS),
                       binding("ClusterRoleBinding", "ClusterRole", "r")], "ops", "op")
    assert allows(wide, get_cm("team-a")) and allows(wide, get_cm("team-b"))
    assert allows(wide, Attributes(None, "", "namespaces", "list"))
    # Bound by a RoleBinding: that namespace only, and no cluster-scoped kind at all.
    narrow = granted_to([role("ClusterRole", "r", READ_CMS, LIST_NS),
                         binding("RoleBinding", "ClusterRole", "r", "team-a")], "ops", "op")
    assert allows(narrow, get_cm("team-a")) and not allows(narrow, get_cm("team-b"))
    assert not allows(narrow, Attributes(None, "", "namespaces", "list"))
    own = granted_to([role("Role", "r", READ_CMS, namespace="ops"),
                      binding("RoleBinding", "Role", "r", "ops")], "ops", "op")
    assert allows(own, get_cm("ops")) and not allows(own, get_cm("team-a"))


def test_bindings_of_others_and_of_roles_not_there_grant_nothing() -> None:
    other = {"kind": "ServiceAccount", "name": "op", "namespace": "elsewhere"}
    assert granted_to([role("ClusterRole", "r", READ_CMS),
                       binding("ClusterRoleBinding", "ClusterRole", "r", subject=other),
                       binding("ClusterRoleBinding", "ClusterRole", "missing")],
                      "ops", "op") == []
    # A RoleBinding reaches a Role of its own namespace only.
    assert granted_to([role("Role", "r", READ_CMS, namespace="ops"),
                       binding("RoleBinding", "Role", "r", "team-a")], "ops", "op") == []


def ref(uid: str = "u1", *, blocking: bool = True) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment", "name": "chat",
            "uid": uid, "controller": True, "blockOwnerDeletion": blocking}


def owned(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "chat", "ownerReferences": list(refs)}}


def checks(old: dict[str, Any] | None, new: dict[str, Any]) -> list[tuple[str, str]]:
    call = Attributes("team-a", "apps", "deployments", "patch" if old else "create", "chat")
    found = owner_reference_checks(
        call, old, new, lambda api, kind: ("slopilot.dev", "llmdeployments")
        if (api, kind) == ("slopilot.dev/v1alpha1", "LLMDeployment") else None)
    assert all(c.namespace == "team-a" for c in found)
    return [(c.verb, f"{c.resource}/{c.name}") for c in found]


def test_the_owner_reference_plugin_asks_what_the_api_server_asks() -> None:
    finalizers = ("update", "llmdeployments/finalizers/chat")
    assert checks(None, owned()) == []
    assert checks(None, owned(ref())) == [finalizers]
    assert checks(None, owned(ref(blocking=False))) == []
    assert checks(owned(ref()), owned(ref())) == []  # unchanged: nothing asked
    # An update that changes the references at all needs delete on the object itself.
    assert checks(owned(ref()), owned(ref(), ref("u2", blocking=False))) == [
        ("delete", "deployments/chat")]
    assert checks(owned(ref(blocking=False)), owned(ref())) == [
        ("delete", "deployments/chat"), finalizers]


def test_the_emulator_refuses_a_blocking_owner_reference_without_the_finalizers_grant(
        kube: RunningEmulator, tmp_path: Path) -> None:
    kube.install(crd_manifest())
    base = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}]
    finalizers = {"apiGroups": ["slopilot.dev"], "resources": ["llmdeployments/finalizers"],
                  "verbs": ["update"]}
    kube.emulator.enforce_owner_references = True
    clients = {}
    for name, rules in (("plain", base), ("owner", [*base, finalizers])):
        kube.emulator.restrict(f"{name}-token", name, granted_to(
            [role("ClusterRole", name, *rules),
             binding("ClusterRoleBinding", "ClusterRole", name)], "ops", "op"))
        config = kube.kubeconfig_as(f"{name}-token", tmp_path / name)
        clients[name] = Kube(kubernetes.config.new_client_from_config(config_file=str(config)))
    body = {"apiVersion": "v1", "kind": "ConfigMap", **owned(ref())}
    with pytest.raises(ApiError, match="cannot set blockOwnerDeletion") as refused:
        clients["plain"].create("v1", "configmaps", "default", body)
    assert refused.value.status == 403
    assert kube.emulator.refused == [("plain", Attributes(
        "default", "slopilot.dev", "llmdeployments/finalizers", "update", "chat"))]
    clients["owner"].create("v1", "configmaps", "default", body)
    # Changing the references of an existing object asks delete on it, which neither has.
    with pytest.raises(ApiError, match="cannot set an ownerRef on a resource you can't"):
        clients["owner"].patch("v1", "configmaps", "default", "chat",
                               {"metadata": {"ownerReferences": [ref(blocking=False)]}})
    # Without the plugin (the API server's default), neither check is made.
    kube.emulator.enforce_owner_references = False
    clients["plain"].create("v1", "configmaps", "default",
                            {**body, "metadata": {**body["metadata"], "name": "other"}})
