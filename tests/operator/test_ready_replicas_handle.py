"""The handle tells asked replicas from ready ones, and runs a canary only beside another.

The reviewer's scenario on the emulator (which runs no Deployment controller: the pods
are the test's): one ready pod, a scale to 3 that a GPU quota holds at one.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import (
    Cluster,
    add_pod,
    llmd,
    operator_mint,
    replica_set,
    with_namespaces,
)
from tests.operator.standins import PodStandIn
from tests.support.kube_server import serve_emulator

TRIAL = {"token_budget": 512, "chunk_size": 256}
QUOTA = ('pods "chat-5d8f7c9b4-x2" is forbidden: exceeded quota: gpu, requested: '
         'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, limited: '
         'requests.nvidia.com/gpu=1')


@pytest.fixture
def scaled(tmp_path: pathlib.Path) -> Iterator[tuple[Cluster, KubeDeploymentHandle,
                                                     list[PodStandIn]]]:
    with serve_emulator(tmp_path) as kube, kube.api_client() as client:
        c = with_namespaces(kube, Cluster(client))
        c.create(llmd(replicas={"min": 1, "max": 4}, resources={"gpu": 1}))
        mint, policy = operator_mint(c), OperatorPolicy()
        reconcile(c.kube, c.get("chat"), policy=policy, mint=mint)
        pod = PodStandIn(mint.for_body(c.get("chat")),
                         parse_spec(c.get("chat")).engine.to_dict())
        pods = [pod]
        try:
            add_pod(c, "chat", 0, pod.port)
            handle = KubeDeploymentHandle(c.kube, "default", "chat", mint=mint,
                                          policy=policy)
            handle.scale(3)  # the quota holds one GPU: no pod is made for the others
            yield c, handle, pods
        finally:
            for p in pods:
                p.close()


def test_asked_and_ready_are_told_apart(scaled: tuple[Cluster, KubeDeploymentHandle,
                                                       list[PodStandIn]]) -> None:
    _, handle, _ = scaled
    assert handle.replicas() == 3
    counts = handle.replica_counts()
    assert (counts.asked, counts.ready, counts.short) == (3, 1, 2)


def test_the_cause_is_read_from_the_replica_set(scaled: tuple[
        Cluster, KubeDeploymentHandle, list[PodStandIn]]) -> None:
    c, handle, _ = scaled
    rs = replica_set(c, "chat")
    c.kube.patch("apps/v1", "replicasets", c.namespace, rs["metadata"]["name"],
                 {"status": {"replicas": 1, "conditions": [{
                     "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                     "message": QUOTA}]}}, subresource="status")
    why = handle.replica_counts().why_not_ready
    assert why is not None and "FailedCreate" in why and "exceeded quota" in why


def test_no_canary_on_the_only_ready_pod(scaled: tuple[Cluster, KubeDeploymentHandle,
                                                        list[PodStandIn]]) -> None:
    _, handle, (pod,) = scaled
    with pytest.raises(ApplyError, match="canary needs 2 ready pods"):
        handle.apply_config(TRIAL, canary=True, trial=True)
    assert not pod.puts  # the one serving pod took nothing


def test_a_canary_beside_another_ready_pod(scaled: tuple[Cluster, KubeDeploymentHandle,
                                                          list[PodStandIn]]) -> None:
    c, handle, pods = scaled
    other = PodStandIn(pods[0].token, pods[0].config)
    pods.append(other)
    add_pod(c, "chat", 1, other.port)
    counts = handle.replica_counts()
    assert (counts.asked, counts.ready) == (3, 2)
    name = handle.apply_config(TRIAL, canary=True, trial=True)
    canary, beside = (pods[0], pods[1]) if name == "chat-pod-0" else (pods[1], pods[0])
    assert name in ("chat-pod-0", "chat-pod-1")
    assert len(canary.puts) == 1 and not beside.puts
