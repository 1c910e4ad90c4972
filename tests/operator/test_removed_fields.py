"""A field removed from the spec leaves the owned objects, not only a field changed.

The reconcile writes JSON merge patches and judges drift by ``covers`` (the live object
carries every desired field), both of which keep whatever the desired object no longer
names. For the maps the operator alone fills (the engine ConfigMap's files, a container's
resource amounts) a key it no longer renders is a stale value the pods still act on.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Change, reconcile
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.operator.test_spec_clients import grants
from tests.support.kube_server import RunningEmulator


def _reconciled(kube_client: kubernetes.client.ApiClient, cluster: Cluster
                ) -> dict[str, Change]:
    return reconcile(Kube(kube_client), cluster.get(), policy=OperatorPolicy(),
                     mint=operator_mint(cluster)).changes


def _engine_container(kube_client: kubernetes.client.ApiClient) -> dict[str, Any]:
    deployment = Kube(kube_client).get("apps/v1", "deployments", NS, "chat")
    assert deployment is not None
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return dict(next(c for c in containers if c["name"] == "engine"))


def test_removing_clients_removes_the_grants_file_from_the_configmap(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """Without a null for it, the grants file stayed after spec.clients was removed: a
    stale copy of keys the tenant meant to revoke, which a later ``--clients`` reads."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(clients=grants()))
    _reconciled(kube_client, cluster)
    cm = Kube(kube_client).get("v1", "configmaps", NS, "chat-engine")
    assert cm is not None and "clients.json" in cm["data"]
    cluster.patch("chat", {"spec": {"clients": None}})
    assert _reconciled(kube_client, cluster)["ConfigMap/chat-engine"] is Change.PATCHED
    cm = Kube(kube_client).get("v1", "configmaps", NS, "chat-engine")
    assert cm is not None
    assert sorted(cm["data"]) == ["alerts.json", "engine.json", "slo.json"]
    assert _reconciled(kube_client, cluster)["ConfigMap/chat-engine"] is Change.UNCHANGED


def test_removing_a_resource_amount_removes_it_from_the_engine_container(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """The live container's extra memory limit covered a desired container without one,
    so removing spec.resources.memory never reached the pods (their old limit stayed)."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd(resources={"cpu": "2", "memory": "8Gi"}))
    _reconciled(kube_client, cluster)
    assert _engine_container(kube_client)["resources"]["limits"]["memory"] == "8Gi"
    cluster.patch("chat", {"spec": {"resources": {"memory": None}}})
    assert _reconciled(kube_client, cluster)["Deployment/chat"] is Change.PATCHED
    resources = _engine_container(kube_client)["resources"]
    assert "memory" not in resources.get("limits", {})
    assert "memory" not in resources.get("requests", {})
    assert _reconciled(kube_client, cluster)["Deployment/chat"] is Change.UNCHANGED
    cluster.patch("chat", {"spec": {"resources": None}})
    assert _reconciled(kube_client, cluster)["Deployment/chat"] is Change.PATCHED
    assert not _engine_container(kube_client).get("resources")


def test_what_admission_adds_to_the_engine_container_is_left_alone(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """A namespace's LimitRange gives a container without limits its defaults at
    admission: a drift check that called every amount the render lacks drift would patch
    the Deployment at every reconcile, and admission would add them back."""
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd())
    _reconciled(kube_client, cluster)
    k = Kube(kube_client)
    live = k.get("apps/v1", "deployments", NS, "chat")
    assert live is not None
    containers = live["spec"]["template"]["spec"]["containers"]
    defaulted = {"limits": {"memory": "4Gi"}, "requests": {"memory": "4Gi"}}
    for c in containers:
        c["resources"] = defaulted
    k.patch("apps/v1", "deployments", NS, "chat",
            {"spec": {"template": {"spec": {"containers": containers}}}})
    assert _reconciled(kube_client, cluster)["Deployment/chat"] is Change.UNCHANGED
    assert _engine_container(kube_client)["resources"] == defaulted
