"""``status.readyReplicas`` while tuning is off: the replicas the CR's own Deployment says
serve, written by the spec reconcile and by the repair at each of the Deployment's
status writes, a refused spec's included (its pods serve on), and only where it
changed."""

# mypy: disable-error-code="index"

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from slopilot.operator import handlers
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Outcome, reconcile
from slopilot.operator.spec_status import status_of, untuned_ready
from slopilot.operator.status_writer import write_status
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.support.kube_server import RunningEmulator

log = logging.getLogger("test")


@pytest.fixture(autouse=True)
def crd(kube: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.install(crd_manifest())
    monkeypatch.setattr(handlers, "post_events", lambda *a, **k: None)


def memo_of(cluster: Cluster) -> SimpleNamespace:
    return SimpleNamespace(kube=cluster.kube, locks=LockTable(), policy=OperatorPolicy(),
                           tokens=operator_mint(cluster))


def spec_reconcile(cluster: Cluster, memo: SimpleNamespace) -> Outcome:
    """What ``handlers.reconcile_spec`` writes, without kopf's pod syncs."""
    body = cluster.get()
    out = reconcile(memo.kube, body, policy=memo.policy, mint=memo.tokens)
    ready = untuned_ready(memo.kube, body)
    write_status(memo.kube, NS, "chat", lambda fresh: status_of(fresh, out, ready))
    return out


def serving(cluster: Cluster, ready: int) -> None:
    """The Deployment controller's status write as ``ready`` pods serve."""
    cluster.kube.patch("apps/v1", "deployments", NS, "chat",
                       {"status": {"replicas": ready, "readyReplicas": ready}},
                       subresource="status")


def status_writes(kube: RunningEmulator) -> int:
    return sum(1 for r in list(kube.emulator._requests)
               if r.method.value == "PATCH" and r.subresource == "status"
               and r.resource is not None and r.resource.plural == "llmdeployments")


def test_the_count_follows_the_deployment_through_a_refused_spec(
        kube: RunningEmulator, cluster: Cluster) -> None:
    memo = memo_of(cluster)
    cluster.create(llmd(tuning={"enabled": False}, replicas={"min": 2, "max": 2}))
    spec_reconcile(cluster, memo)
    assert cluster.status()["readyReplicas"] == 0
    serving(cluster, 2)
    handlers.repair(cluster.get(), memo, log)
    assert cluster.status()["readyReplicas"] == 2
    # Another's Service takes the name: the spec is refused, the pods serve on.
    cluster.kube.delete("v1", "services", NS, "chat")
    cluster.kube.create("v1", "services", NS, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"},
        "spec": {"ports": [{"port": 80}]}})
    out = spec_reconcile(cluster, memo)
    assert not out.valid
    serving(cluster, 1)
    handlers.repair(cluster.get(), memo, log)
    assert cluster.status()["readyReplicas"] == 1
    # The same count again writes nothing.
    before = status_writes(kube)
    handlers.repair(cluster.get(), memo, log)
    assert status_writes(kube) == before


def test_a_deployment_that_is_not_the_crs_counts_none_of_its_pods(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A Deployment of the CR's name that another made (or the last CR of the name left)
    serves none of this CR's replicas, whatever its status says."""
    memo = memo_of(cluster)
    cluster.create(llmd(tuning={"enabled": False}))
    spec_reconcile(cluster, memo)
    serving(cluster, 1)
    dep: dict[str, Any] = cluster.kube.get("apps/v1", "deployments", NS, "chat")
    cluster.kube.patch("apps/v1", "deployments", NS, "chat", {"metadata": {
        "ownerReferences": [{**dep["metadata"]["ownerReferences"][0], "uid": "another"}]}})
    assert untuned_ready(cluster.kube, cluster.get()) == 0


def test_tuning_on_leaves_the_count_to_the_daemon(cluster: Cluster) -> None:
    memo = memo_of(cluster)
    cluster.create(llmd())
    spec_reconcile(cluster, memo)
    assert untuned_ready(cluster.kube, cluster.get()) is None
    assert "readyReplicas" not in cluster.status()
