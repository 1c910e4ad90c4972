"""A tenant's image answers the operator's calls to its admin API: whatever it answers,
what the operator writes and sends because of it stays bounded.

The sync of a deployment's pods runs once a minute (tuning_daemon.CONFIG_SYNC_S), by the
timer while tuning is off and by the daemon while it is on; both record what it found in
the PodsConfigured condition (pods_status.py).
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import itertools
import logging
from typing import Any

import kopf
import pytest

from slopilot.operator.handlers import LockTable, sync_untuned_pods
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import Cluster, add_pod, llmd
from tests.operator.standins import PodStandIn, serving
from tests.operator.test_live_config import (
    _pods_condition,
    _status_writes,
    reconciled,
    spec_config,
)
from tests.support.kube_server import RunningEmulator


class Pods:
    """A reconciled ``chat`` with tuning off, its pods' stand-ins, and the timer's sync."""

    def __init__(self, kube: RunningEmulator, cluster: Cluster, count: int) -> None:
        _, policy, mint = reconciled(kube, cluster, llmd(tuning={"enabled": False}))
        self.cluster = cluster
        self.want = spec_config(cluster)
        self.token = mint.for_body(cluster.get())
        self.slo = parse_spec(cluster.get()).slo.to_dict()
        self.standins = [PodStandIn(self.token, self.want, self.slo) for _ in range(count)]
        self.memo = kopf.Memo(kube=cluster.kube, tokens=mint, policy=policy,
                              locks=LockTable())

    def add(self) -> None:
        for i, pod in enumerate(self.standins):
            add_pod(self.cluster, "chat", i, pod.port)

    def sync(self) -> None:
        sync_untuned_pods(body=self.cluster.get(), memo=self.memo,
                          logger=logging.getLogger("test"))


@pytest.mark.parametrize("varies", ["restart-knob", "error-content-type"])
def test_a_pod_answering_anew_each_sync_does_not_rewrite_the_condition(
        kube: RunningEmulator, cluster: Cluster, varies: str) -> None:
    """The condition's message quotes what a pod answered (a restart knob's value, an
    error's content type): an image that answered something new each time had the CR's
    status written at every sync, once a minute for as long as it ran. The condition is
    written when its meaning changes (its status, its reason, the pods it names)."""
    pods = Pods(kube, cluster, 2)
    shifty = pods.standins[1]
    asked = itertools.count()

    def answer_anew(method: str, path: str) -> None:
        if (method, path) != ("GET", "/admin/config"):
            return
        n = next(asked)
        with shifty.lock:
            if varies == "restart-knob":
                shifty.config = {**pods.want, "block_size": 32 + n}
            else:
                shifty.raw_gets[path] = (500, f"text/x-{n}", b"{}")

    shifty.on_request = answer_anew
    with serving(*pods.standins):
        pods.add()
        pods.sync()
        cond = _pods_condition(cluster)
        assert cond is not None and cond["status"] == "False", cond
        assert cond["message"].startswith("chat-pod-1"), cond
        writes = _status_writes(kube)
        for _ in range(3):
            pods.sync()
        assert next(asked) == 4  # every sync asked it, and it answered anew
    assert _status_writes(kube) == writes
    assert _pods_condition(cluster) == cond


def test_the_condition_is_written_again_once_it_names_other_pods(
        kube: RunningEmulator, cluster: Cluster) -> None:
    pods = Pods(kube, cluster, 2)
    with serving(*pods.standins):
        pods.add()
        with pods.standins[1].lock:
            pods.standins[1].config = {**pods.want, "block_size": 32}
        pods.sync()
        assert _pods_condition(cluster)["message"].startswith("chat-pod-1"), \
            _pods_condition(cluster)
        with pods.standins[0].lock:
            pods.standins[0].config = {**pods.want, "swap_space_gb": 1}
        pods.sync()
        cond: dict[str, Any] = _pods_condition(cluster)
    assert cond["status"] == "False"
    assert cond["message"].startswith("chat-pod-0: runs swap_space_gb=1"), cond
    assert "; chat-pod-1: runs block_size=32" in cond["message"]
