"""A KopfPeering in every namespace kopf serves, whenever it starts serving it.

kopf pauses the whole operator while any namespace it serves lacks its peering object
(peering_keeper.py). Found with the namespaced install: a tenant's namespace deleted
and created again froze every tenant, and a ``--namespace 'team-*'`` glob never acted.
The operator runs here as its ServiceAccount with the documented namespaced RBAC
(RoleBindings and ``slopilot-operator-namespaced``), so the keeper's list and watch of
namespaces is shown to need nothing more than kopf's own.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.peering_keeper import keep_peerings
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.study_reclaim import serving
from tests.operator.operator_support import Cluster, llmd, wait_for
from tests.operator.test_operator_rbac import (
    ACCOUNT,
    MANIFESTS,
    TOKEN,
    USER,
    Operator,
    namespaced,
)
from tests.support.kube_authz import granted_to
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

PEERING = "slopilot"


def namespace(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, **meta}}


def peering_in(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    return cluster.kube.get("kopf.dev/v1", "kopfpeerings", ns, PEERING)


def creates_in(kube: RunningEmulator, ns: str) -> list[str]:
    return [r.method.value for r in list(kube.emulator)
            if r.method.value == "POST" and r.resource is not None
            and r.resource.plural == "kopfpeerings" and r.namespace == ns]


def kopf_lists_of_peerings_in(kube: RunningEmulator, ns: str) -> int:
    """How often a watcher of the peering objects in ``ns`` started (kopf's, each time
    it starts serving ``ns``): a GET of the collection there, no name."""
    return sum(1 for r in list(kube.emulator)
               if r.method.value == "GET" and r.resource is not None
               and r.resource.plural == "kopfpeerings" and r.namespace == ns
               and r.name is None)


@pytest.fixture
def peering_crds(kube: RunningEmulator) -> None:
    kube.install(crd_manifest(), *yaml.safe_load_all(
        (MANIFESTS / "kopf-peering.yaml").read_text(encoding="utf-8")))


def test_the_keeper_makes_one_in_each_served_namespace_as_it_comes(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, peering_crds: None,
        caplog: pytest.LogCaptureFixture) -> None:
    cluster = Cluster(kube_client)
    # team-gone is Terminating before the keeper starts (a finalizer holds it): the API
    # server would refuse a create there, so none is tried.
    kube.install(namespace("team-a"), namespace("other"),
                 namespace("team-gone", finalizers=["test/hold"]))
    cluster.core.delete_namespace("team-gone")
    assert cluster.core.read_namespace("team-gone").metadata.deletion_timestamp
    stop = threading.Event()
    keeper = threading.Thread(target=keep_peerings, args=(
        Kube(kube_client), PEERING, serving(["team-*"]), stop), daemon=True)
    with caplog.at_level(logging.WARNING):
        keeper.start()
        try:
            wait_for(lambda: peering_in(cluster, "team-a"), what="team-a's peering object")
            cluster.core.create_namespace(namespace("team-new"))  # a glob's new match
            wait_for(lambda: peering_in(cluster, "team-new"), what="team-new's")
            # Deleted (its peering object with it) and created again: a new namespace.
            cluster.kube.delete("kopf.dev/v1", "kopfpeerings", "team-a", PEERING)
            cluster.core.delete_namespace("team-a")
            cluster.core.create_namespace(namespace("team-a"))
            wait_for(lambda: peering_in(cluster, "team-a"), what="the new team-a's")
            wait_for(lambda: "namespace team-gone is being deleted" in caplog.text,
                     what="the warning about team-gone")
        finally:
            stop.set()
    assert peering_in(cluster, "other") is None  # not served
    # Each came through the watch: its first event failed ('raw_object'), and each new
    # namespace waited for the listing 30 s later (and kopf paused every namespace).
    assert "list or watch of namespaces" not in caplog.text, caplog.text
    assert creates_in(kube, "team-gone") == []
    assert creates_in(kube, "team-a") == ["POST", "POST"]


def start_operator(kube: RunningEmulator, tmp_path: Path, *args: str) -> Operator:
    """The operator's process as the ServiceAccount, peered unless ``--standalone``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "KUBECONFIG": str(kube.kubeconfig_as(TOKEN, tmp_path / "sa.kubeconfig")),
           "SLOPILOT_CONTROLLER_FACTORY": "tests.operator.standins:build_controller",
           "SLOPILOT_CONTROLLER_TICK_S": "0.2",
           "SLOPILOT_OPERATOR_NAMESPACE": DEFAULT_OPERATOR_NAMESPACE,
           "SLOPILOT_ALLOWED_STORAGE": f"sqlite:///{tmp_path}/*",
           "SLOPILOT_DEFAULT_STORAGE": f"sqlite:///{tmp_path}/study.db"}
    env.pop("POD_ID", None)
    log = (tmp_path / "operator.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slopilot.cli", "operator", *args,
         *(() if "--standalone" in args else ("--peering", PEERING))],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    return Operator(proc, log)


@pytest.fixture
def operators() -> Iterator[list[Operator]]:
    started: list[Operator] = []
    yield started
    for op in started:
        if op.proc.poll() is None:
            op.proc.kill()
            op.proc.wait(timeout=HANG_GUARD_S)
        print(f"--- operator ---\n{op.output()}")  # shown when the test fails
        op.log.close()


def served_by(kube: RunningEmulator, *teams: str) -> None:
    kube.install(*(namespace(n) for n in (DEFAULT_OPERATOR_NAMESPACE, *teams)))
    kube.emulator.restrict(TOKEN, USER, granted_to(namespaced(teams),
                                                   DEFAULT_OPERATOR_NAMESPACE, ACCOUNT))


def test_a_glob_of_namespaces_is_served(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, tmp_path: Path,
        peering_crds: None, operators: list[Operator]) -> None:
    served_by(kube, "team-a")
    operators.append(op := start_operator(kube, tmp_path, "--namespace", "team-*"))
    cluster = Cluster(kube_client, namespace="team-a")
    body = llmd(tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-a"
    cluster.create(body)
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
             what="team-a's Deployment")
    assert peering_in(cluster, "team-a") is not None
    assert op.stop() == 0, op.output()


def test_a_namespace_deleted_and_created_again_pauses_no_other(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, tmp_path: Path,
        peering_crds: None, operators: list[Operator]) -> None:
    served_by(kube, "team-a", "team-b")
    operators.append(op := start_operator(kube, tmp_path, "--namespace", "team-a",
                                    "--namespace", "team-b"))
    cluster = Cluster(kube_client, namespace="team-a")
    body = llmd(tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-a"
    cluster.create(body)
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
             what="team-a's Deployment")

    # team-b goes, its peering object with it, and comes back empty. Once kopf serves it
    # again (its watcher of team-b's peering objects lists them anew), it holds the
    # operator paused until it sees one there: team-a's edit waits on that.
    lists = kopf_lists_of_peerings_in(kube, "team-b")
    cluster.kube.delete("kopf.dev/v1", "kopfpeerings", "team-b", PEERING)
    cluster.core.delete_namespace("team-b")
    cluster.core.create_namespace(namespace("team-b"))
    wait_for(lambda: kopf_lists_of_peerings_in(kube, "team-b") > lists,
             what="kopf serving the new team-b")
    cluster.patch("chat", {"spec": {"replicas": {"min": 2, "max": 3}}})
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat")["spec"][
        "replicas"] == 2, what="team-a's edit acted on")
    assert peering_in(cluster, "team-b") is not None
    assert op.stop() == 0, op.output()
