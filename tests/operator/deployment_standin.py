"""The Deployment controller the emulator lacks, for one Deployment: its pods come and go.

The emulator runs no controller, so a Deployment's pods were only those a test added by
hand, and a scale bought none: a loop that waits for the replicas it bought waited on
the emulator for ever. ``DeploymentStandIn`` does what the Deployment and ReplicaSet
controllers do for the scale the operator asks: its ReplicaSet keeps ``spec.replicas``
pods, each a ready ``PodStandIn`` taking the operator's admin token, and a scale-down
removes the newest. With ``quota`` (pods the namespace's quota admits), the pods past it
are never made and the ReplicaSet carries the ``ReplicaFailure`` condition a quota's
``FailedCreate`` leaves, as the API server's admission refuses them.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from tests.operator.operator_support import Cluster, add_pod, operator_token, replica_set
from tests.operator.standins import PodStandIn

log = logging.getLogger(__name__)
PERIOD_S = 0.05


def quota_message(name: str, index: int, quota: int) -> str:
    return (f'pods "{name}-pod-{index}" is forbidden: exceeded quota: gpu-quota, requested: '
            f"requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu={quota}, limited: "
            f"requests.nvidia.com/gpu={quota}")


class DeploymentStandIn:
    """Keeps the ready pods of Deployment ``name`` at its ``spec.replicas`` (module
    docstring); a context manager: its thread stops and its pods close on exit."""

    def __init__(self, cluster: Cluster, name: str = "chat", *,
                 quota: int | None = None) -> None:
        self.cluster, self.name, self.quota = cluster, name, quota
        self.pods: list[PodStandIn] = []
        self.refused = False
        self._said_ready: int | None = None
        self._token: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"deployment-standin-{name}")

    def __enter__(self) -> DeploymentStandIn:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        for pod in self.pods:
            pod.close()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            try:
                self.step()
            except Exception:  # the emulator stopping under it: the next look says
                log.debug("deployment stand-in step failed", exc_info=True)

    def step(self) -> None:
        dep = self.cluster.owned("apps/v1", "deployments", self.name)
        if dep is None:
            return
        want = int((dep.get("spec") or {}).get("replicas", 1))
        admitted = want if self.quota is None else min(want, self.quota)
        if self._token is None:
            self._token = operator_token(self.cluster, self.name)
        while len(self.pods) < admitted:
            pod = PodStandIn(self._token)
            add_pod(self.cluster, self.name, len(self.pods), pod.port)
            self.pods.append(pod)
        while len(self.pods) > want:
            pod = self.pods.pop()
            self.cluster.core.delete_namespaced_pod(f"{self.name}-pod-{len(self.pods)}",
                                                    self.cluster.namespace)
            pod.close()
        if self._said_ready != len(self.pods):
            # As the Deployment controller does: its status follows the pods, and the
            # write is an event on the Deployment for whoever watches it.
            self.cluster.kube.patch("apps/v1", "deployments", self.cluster.namespace,
                                    self.name, {"status": {
                                        "replicas": len(self.pods),
                                        "readyReplicas": len(self.pods)}},
                                    subresource="status")
            self._said_ready = len(self.pods)
        refused = admitted < want
        if refused != self.refused:
            self._condition(refused, admitted)
            self.refused = refused

    def _condition(self, refused: bool, admitted: int) -> None:
        rs = replica_set(self.cluster, self.name)
        conditions: list[dict[str, Any]] = [{
            "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
            "message": quota_message(self.name, admitted, admitted)}] if refused else []
        self.cluster.kube.patch("apps/v1", "replicasets", self.cluster.namespace,
                                rs["metadata"]["name"],
                                {"status": {"replicas": admitted, "conditions": conditions}},
                                subresource="status")
