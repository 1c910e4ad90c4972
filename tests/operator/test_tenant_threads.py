"""One tenant's slow pods cannot take the operator's handler threads from the others.

kopf runs every sync handler of every tenant on one pool of threads. With tuning off, a
built-in engine CR's pods are synced by the handlers (the config-sync timer, the
reconcile), and the pods run the tenant's image, which may answer the operator's reads
just inside each deadline on purpose. Here such an image answers only when the test says
(the operator's wall-clock deadlines lifted, so the hold does not depend on how fast the
machine is), on a pool of 4 threads standing in for kopf's.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator import handlers, pod_admin
from slopilot.operator.handlers import (
    DEFERRED_SYNCS,
    LockTable,
    reconcile_llmdeployment,
    repair,
    sync_untuned_pods,
)
from slopilot.operator.pod_sync_share import PodSyncShare
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import (
    Cluster,
    add_pod,
    llmd,
    operator_mint,
    wait_for,
    with_namespaces,
)
from tests.operator.standins import PodStandIn
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

KOPF_THREADS = 4
log = logging.getLogger("test")


class SlowImage:
    """A tenant's image that answers the operator only once ``answer`` is set."""

    def __init__(self) -> None:
        self.answer = threading.Event()
        self.lock = threading.Lock()
        self.waiting = 0  # requests held now

    def __call__(self, method: str, path: str) -> None:
        with self.lock:
            self.waiting += 1
        try:
            # Past the test's own waits: the pod must not give up before a wait does.
            assert self.answer.wait(2 * HANG_GUARD_S), "the test never let the pod answer"
        finally:
            with self.lock:
                self.waiting -= 1

    def held(self) -> int:
        with self.lock:
            return self.waiting


class Tenants:
    """Namespaces of LLMDeployments, each reconciled once, with one pod each."""

    def __init__(self, kube: RunningEmulator, client: kubernetes.client.ApiClient,
                 *namespaces: str) -> None:
        self.client = client
        first = with_namespaces(kube, Cluster(client, namespaces[0]), *namespaces)
        self.policy, self.mint = OperatorPolicy(), operator_mint(first)
        self.pods: list[PodStandIn] = []
        # kopf's memo: what the startup sets, shared by every CR through its own copy.
        self.memo = kopf.Memo(kube=first.kube, tokens=self.mint, policy=self.policy,
                              locks=LockTable(),
                              pod_syncs=PodSyncShare(per_namespace=1, total=3))
        self._memos: dict[str, kopf.Memo] = {}

    def cluster(self, namespace: str) -> Cluster:
        return Cluster(self.client, namespace)

    def deployment(self, namespace: str, name: str, *, running: Mapping[str, Any] | None = None,
                   slow: SlowImage | None = None) -> PodStandIn:
        """CR ``namespace/name`` (tuning off) and its pod, running the spec's config but
        for ``running``, answering as ``slow`` lets it."""
        cluster = self.cluster(namespace)
        body = llmd(name, tuning={"enabled": False})
        body["metadata"]["namespace"] = namespace
        created = cluster.create(body)
        assert reconcile(cluster.kube, created, policy=self.policy, mint=self.mint).valid
        fresh = cluster.get(name)
        spec = parse_spec(fresh)
        pod = PodStandIn(self.mint.for_body(fresh), {**spec.engine.to_dict(), **(running or {})},
                         spec.slo.to_dict())
        pod.on_request = slow
        self.pods.append(pod)
        add_pod(cluster, name, 0, pod.port)
        return pod

    def memo_of(self, namespace: str, name: str) -> kopf.Memo:
        """The CR's memo, as kopf keeps one per object (a copy of the operator's)."""
        return self._memos.setdefault(f"{namespace}/{name}", copy.copy(self.memo))

    def timer(self, pool: ThreadPoolExecutor, namespace: str, name: str) -> Future[None]:
        """The config-sync timer of ``namespace/name``, as kopf runs it on its pool."""
        return pool.submit(sync_untuned_pods, body=self.cluster(namespace).get(name),
                           memo=self.memo_of(namespace, name), logger=log)


@pytest.fixture
def lifted_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's wall-clock bounds on a pod's answers out of the way: the slow image
    holds each request until the test lets it answer."""
    far = 4 * HANG_GUARD_S
    monkeypatch.setattr(handlers, "HTTP_TIMEOUT_S", far)
    monkeypatch.setattr(pod_admin, "POD_ANSWER_DEADLINE_S", far)
    monkeypatch.setattr(pod_admin, "SYNC_DEADLINE_S", far)
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: None)  # kopf's context


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """kopf's pool of handler threads, small."""
    with ThreadPoolExecutor(max_workers=KOPF_THREADS, thread_name_prefix="kopf") as out:
        yield out


def pods_condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.condition("PodsConfigured", name)


def test_a_namespaces_slow_pods_leave_kopfs_threads_to_other_namespaces(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, pool: ThreadPoolExecutor) -> None:
    """As many CRs in team-a as kopf has threads, each timer's sync waiting on its slow
    pod: every thread was held, and team-b's sync (its reconciles, drift repairs and
    deletions alike) waited for team-a's images. team-a's syncs now hold one thread (its
    share here); the others are refused at once, say so in their PodsConfigured
    condition, and run at the timer's next interval."""
    tenants = Tenants(kube, kube_client, "team-a", "team-b")
    slow = SlowImage()
    try:
        names = [f"chat-{i}" for i in range(KOPF_THREADS)]
        for name in names:
            tenants.deployment("team-a", name, slow=slow)
        behind = tenants.deployment("team-b", "chat", running={"token_budget": 512})
        want = parse_spec(tenants.cluster("team-b").get("chat")).engine.to_dict()
        a_syncs = [tenants.timer(pool, "team-a", name) for name in names]
        wait_for(lambda: slow.held() + sum(f.done() for f in a_syncs) == len(names),
                 what="each of team-a's syncs waiting on its pod, or over")
        assert slow.held() == 1, (f"{slow.held()} of kopf's {KOPF_THREADS} threads wait "
                                  "on team-a's pods")
        b_sync = tenants.timer(pool, "team-b", "chat")
        wait_for(b_sync.done, what="team-b's sync, on a thread team-a left")
        b_sync.result()
        with behind.lock:
            assert {k: behind.config.get(k) for k in want} == want
        # The refused ones' next intervals, their pods still unchecked: said in their
        # condition once a few in a row were (one alone may be timers run together).
        refused = [name for name, sync in zip(names, a_syncs, strict=True) if sync.done()]
        team_a = tenants.cluster("team-a")
        for round_ in range(2, DEFERRED_SYNCS + 1):
            assert all(pods_condition(team_a, name) is None for name in refused), round_
            for sync in [tenants.timer(pool, "team-a", name) for name in refused]:
                sync.result(timeout=HANG_GUARD_S)
        said = [pods_condition(team_a, name) for name in refused]
        assert all(c is not None and c["status"] == "Unknown"
                   and c["reason"] == "SyncDeferred" and "PER_NAMESPACE" in c["message"]
                   for c in said), said
        assert slow.held() == 1
    finally:
        slow.answer.set()
        for pod in tenants.pods:
            pod.close()


def test_a_crs_slow_sync_holds_no_lock_its_repairs_and_reconciles_wait_for(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, pool: ThreadPoolExecutor) -> None:
    """A sync held the CR's lock while it waited on the pods, and every drift repair of
    its owned objects (an event each: its Deployment's status as its pods go ready and
    not, say) and its reconcile waited for that lock, each on a kopf thread: a slow
    image held several threads per CR, past any share of syncs. The sync now holds the
    lock only around its writes, as the daemon's does; the reconcile's own sync, asked
    while the timer's is under way, is run by it once more after it, reading the edit."""
    tenants = Tenants(kube, kube_client, "team-a")
    slow = SlowImage()
    try:
        pod = tenants.deployment("team-a", "chat", slow=slow)
        team_a = tenants.cluster("team-a")
        timer = tenants.timer(pool, "team-a", "chat")
        wait_for(lambda: slow.held() == 1, what="the timer's sync waiting on the pod")
        memo = tenants.memo_of("team-a", "chat")
        fixed = pool.submit(repair, team_a.get("chat"), memo, log)
        wait_for(fixed.done, what="the drift repair, while the sync waits on the pod")
        fixed.result()
        edited = team_a.patch("chat", {"spec": {"engine": {"tokenBudget": 4096}}})
        reconciled = pool.submit(reconcile_llmdeployment, body=edited, memo=memo,
                                 logger=log)
        wait_for(reconciled.done, what="the reconcile, while the sync waits on the pod")
        reconciled.result()
        assert slow.held() == 1 and not timer.done()
        slow.answer.set()
        wait_for(timer.done, what="the timer's sync, once the pod answers")
        timer.result()
        with pod.lock:
            assert pod.config is not None and pod.config["token_budget"] == 4096
    finally:
        slow.answer.set()
        for pod in tenants.pods:
            pod.close()


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_pods_not_checked_are_said_so_only_where_a_sync_would_say_otherwise(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        backend: str) -> None:
    """No sync writes PodsConfigured for vLLM (no admin API): a deferral written there
    would stay for good. Written once per generation, as any change of meaning."""
    from slopilot.operator.pods_status import record_sync_deferred

    tenants = Tenants(kube, kube_client, "team-a")
    cluster = tenants.cluster("team-a")
    body = llmd("chat", backend=backend, tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-a"
    created = cluster.create(body)
    meta = created["metadata"]
    version = None
    for why in ("not checked: first", "not checked: second"):
        record_sync_deferred(cluster.kube, "team-a", "chat", str(meta["uid"]), why,
                             meta.get("generation"))
        said = pods_condition(cluster, "chat")
        if backend == "vllm":
            assert said is None
            continue
        assert said is not None and said["status"] == "Unknown"
        assert said["message"] == "not checked: first"  # not written again
        version = version or cluster.get("chat")["metadata"]["resourceVersion"]
        assert cluster.get("chat")["metadata"]["resourceVersion"] == version
