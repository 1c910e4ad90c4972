"""Shared pieces of the operator's end-to-end tests: bodies, waits, the running operator."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="attr-defined,index,call-overload"

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest
import urllib3
from kopf.testing import KopfRunner

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.owned_meta import selector
from slopilot.operator.pod_layout import ADMIN_PORT_NAME
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.tokens import KEY_SECRET, TokenMint, load_or_create
from tests.operator.standins import PodStandIn
from tests.support import waits
from tests.support.kube_server import RunningEmulator

GROUP, VERSION, PLURAL = "slopilot.dev", "v1alpha1", "llmdeployments"
NS = "default"
RUN_ARGS = ["run", "--standalone", "--all-namespaces", "-m", "slopilot.operator.handlers"]


def thread_stacks() -> str:
    """Every thread's innermost frames: what the process was doing when a wait hung."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame)[-4:])
        out.append(f"--- thread {names.get(ident, ident)}\n{stack}")
    return "\n".join(out)


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """The suite's wait (tests.support.waits) as every operator test wants it.

    A kube read that timed out (Cluster.get bounds each) is polled again, and a hang
    dumps every thread's stack: one full-suite run stalled here once (the status PATCH
    was served, then no GET came back for 15 s) and did not reproduce in isolation.
    """
    return waits.wait_for(condition, what, tolerate=(urllib3.exceptions.HTTPError,),
                          diagnose=thread_stacks)


def llmd(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "smollm2-135m"}, **spec}}


class Cluster:
    """The official client's view of the emulator, with the calls the tests repeat, in
    ``namespace`` (``NS`` unless told)."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str = NS) -> None:
        self.namespace = namespace
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.kube = Kube(client)

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                PLURAL, body))

    def get(self, name: str = "chat") -> dict[str, Any]:
        # A bounded read: a stuck one fails this poll, not the whole wait.
        return dict(self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=(5, 10)))

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return dict(self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, patch))

    def status(self, name: str = "chat") -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def condition(self, type_: str, name: str = "chat") -> dict[str, Any] | None:
        for c in self.status(name).get("conditions") or ():
            if c["type"] == type_:
                return dict(c)
        return None

    def owned(self, api_version: str, plural: str, name: str) -> dict[str, Any] | None:
        """An owned object as a plain dict, None when absent."""
        return self.kube.get(api_version, plural, self.namespace, name)

    def events(self, reason: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items
                if e.reason == reason]


def operator_mint(cluster: Cluster) -> TokenMint:
    """The token key the operator created in its namespace (or creates it, as it would)."""
    return load_or_create(cluster.kube, DEFAULT_OPERATOR_NAMESPACE)


def operator_token(cluster: Cluster, name: str = "chat") -> str:
    """The admin token the operator minted for LLMDeployment ``name``."""
    wait_for(lambda: cluster.kube.get("v1", "secrets", DEFAULT_OPERATOR_NAMESPACE, KEY_SECRET),
             what="the operator's token key")
    return operator_mint(cluster).for_body(cluster.get(name))


def pods_up(cluster: Cluster, pods: list[PodStandIn],
            config: Callable[[], dict[str, Any]] | None = None) -> None:
    """``pods`` as the ready pods of the CR ``chat``'s Deployment, once the operator made
    it, each accepting the admin token the operator minted (and running ``config()``)."""
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"), what="Deployment")
    token = operator_token(cluster)
    for i, pod in enumerate(pods):
        pod.token = token
        if config is not None:
            pod.config = config()
        add_pod(cluster, "chat", i, pod.port)


def wait_steady(cluster: Cluster, what: str = "steady") -> None:
    wait_for(lambda: (cluster.status().get("controller") or {}).get("state") == "steady",
             what=what)


def replica_set(cluster: Cluster, deployment: str, template_hash: str = "5d8f7c9b4"
                ) -> dict[str, Any]:
    """The ReplicaSet the Deployment controller would make (the emulator runs none)."""
    name = f"{deployment}-{template_hash}"
    found = cluster.kube.get("apps/v1", "replicasets", cluster.namespace, name)
    if found is not None:
        return found
    dep = wait_for(lambda: cluster.owned("apps/v1", "deployments", deployment),
                   what=f"the Deployment {deployment}")
    labels = {**selector(deployment), "pod-template-hash": template_hash}
    return cluster.kube.create("apps/v1", "replicasets", cluster.namespace, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": deployment,
            "uid": dep["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "engine", "image": "x"}]}}}})


def add_pod(cluster: Cluster, deployment: str, index: int, port: int, *,
            owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
            pod_ip: str = "127.0.0.1") -> str:
    """A ready engine pod of the deployment's ReplicaSet whose admin port is ``port``.

    ``owner`` / ``labels`` replace the ReplicaSet's reference and the labels, to forge one
    (``owner={}``: no owner at all).
    """
    rs = replica_set(cluster, deployment)
    name = f"{deployment}-pod-{index}"
    ref = owner if owner is not None else {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
        "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    cluster.core.create_namespaced_pod(cluster.namespace, {
        "metadata": {"name": name, "labels": labels if labels is not None
                     else dict(rs["metadata"]["labels"]),
                     "ownerReferences": [ref] if ref else []},
        "spec": {"containers": [{"name": "engine", "image": "x", "ports": [
            {"name": "http", "containerPort": 8000},
            {"name": ADMIN_PORT_NAME, "containerPort": port}]}]}})
    cluster.core.patch_namespaced_pod_status(name, cluster.namespace, {"status": {
        "phase": "Running", "podIP": pod_ip,
        "conditions": [{"type": "Ready", "status": "True"}]}})
    return name


def with_namespaces(kube: RunningEmulator, cluster: Cluster, *names: str) -> Cluster:
    """``cluster`` with the CRD installed and ``names`` made, the operator's own namespace
    too (where its record of study storages lives)."""
    kube.install(crd_manifest())
    for ns in (*names, DEFAULT_OPERATOR_NAMESPACE):
        cluster.kube.create("v1", "namespaces", None, {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return cluster


@contextlib.contextmanager
def operator(kube: RunningEmulator, *extra: str) -> Iterator[KopfRunner]:
    """The operator (kopf with slopilot's handlers) on the emulator; checks a clean exit."""
    crds = {k[2] for k in kube.emulator._objects if not kube.emulator._objects[k].deleted}
    if "llmdeployments.slopilot.dev" not in crds:
        kube.install(crd_manifest())
    with KopfRunner([*RUN_ARGS, *extra], timeout=waits.HANG_GUARD_S) as runner:
        yield runner
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output


def monitoring_crds() -> list[dict[str, Any]]:
    """prometheus-operator's two CRDs, schema-free (only their presence matters here)."""
    out = []
    for kind, plural in (("ServiceMonitor", "servicemonitors"),
                         ("PrometheusRule", "prometheusrules")):
        out.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}]}})
    return out


def daemon_loop(cluster: Cluster, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                *, factory: Any = None, policy: OperatorPolicy | None = None,
                namespace: str = NS) -> Any:
    """The CR's daemon, stepped here (its events, which need kopf's context, dropped);
    its controllers from ``factory`` (default: standins.build_controller)."""
    import logging

    from slopilot.operator import deployment_loop
    from slopilot.operator.cr_locks import LockTable
    from slopilot.operator.deployment_loop import DeploymentLoop
    from tests.operator.standins import build_controller

    monkeypatch.setattr(deployment_loop, "post_decision", lambda *a, **kw: None)
    monkeypatch.setattr(deployment_loop, "post_status_unwritable", lambda *a, **kw: None)
    return DeploymentLoop(cluster.kube, namespace, body["metadata"]["name"],
                          str(body["metadata"]["uid"]), mint=operator_mint(cluster),
                          policy=policy or OperatorPolicy(),
                          factory=factory or build_controller,
                          locks=LockTable(), logger=logging.getLogger("test"))


def sync_timer(body: dict[str, Any], memo: Any) -> None:
    """One run of the config-sync timer (``handlers.sync_untuned_pods``) for ``body``,
    awaited to its sync's end as kopf awaits it, on an event loop of its own and never
    told to stop. ``memo.pod_syncs`` is asked on that loop: a pool kept across runs holds
    nothing between them."""
    import asyncio
    import logging

    from kopf._cogs.aiokits.aioenums import FlagSetter

    from slopilot.operator.handlers import sync_untuned_pods

    timer: Any = sync_untuned_pods  # kopf's type: every kwarg it passes

    async def run() -> None:
        stopper: FlagSetter[Any] = FlagSetter()
        await timer(body=body, memo=memo, logger=logging.getLogger("test"),
                    stopped=stopper.async_waiter)

    asyncio.run(run())


def drift_handler(handler: Any, memo: Any, **kwargs: Any) -> None:
    """A drift handler (``handlers.repair_drift`` at an event, ``retry_drift_repair`` at
    the timer's look) run as kopf runs it, and on to the end of the repair it asks: on an
    event loop of its own, with ``memo.drift_repairs`` made on it (a queue kept across
    runs holds nothing between them)."""
    import asyncio

    from slopilot.operator.drift_repairs import DriftRepairs

    async def run() -> None:
        memo.drift_repairs = DriftRepairs()
        await handler(memo=memo, **kwargs)
        await memo.drift_repairs.settled()

    asyncio.run(run())


class KopfLoop:
    """kopf's event loop on a thread of its own, the pod syncs' pool on it as the
    operator's startup makes it (``pool``): a handler run on another thread asks it as
    one on kopf's threads does."""

    def __init__(self, **pool: int) -> None:
        """``pool``: PodSyncPool's ``threads`` and ``per_namespace`` (default: the
        operator's)."""
        import asyncio

        from slopilot.operator.pod_sync_pool import PodSyncPool

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kopf-loop",
                                       daemon=True)
        self.thread.start()
        self.pool = PodSyncPool(loop=self.loop, **pool)

    def run(self, coroutine: Any) -> Any:
        """``coroutine`` on the loop: a concurrent Future of its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def flushed(self) -> None:
        """Until the loop has run every call handed to it so far (an ask from another
        thread among them): its calls run in order."""
        import asyncio

        self.run(asyncio.sleep(0)).result(waits.HANG_GUARD_S)

    def settled(self) -> None:
        """Until every sync asked so far (from any thread) has ended."""
        self.flushed()
        wait_for(lambda: self.pool.syncs() == 0, what="every pod sync asked so far ended")

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.pool.shutdown)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(waits.HANG_GUARD_S)
        self.loop.close()


@contextlib.contextmanager
def kopf_loop(**pool: int) -> Iterator[KopfLoop]:
    out = KopfLoop(**pool)
    try:
        yield out
    finally:
        out.close()
