"""One tenant's slow pods take neither kopf's handler threads nor every pod sync from the
others.

kopf runs every sync handler of every tenant on one pool of threads, and its async ones
on its event loop. With tuning off, a built-in engine CR's pods are synced after each
reconcile and by a timer, on the pod syncs' own pool (pod_sync_pool.py), and the pods
run the tenant's image, which may answer the operator's reads just inside each deadline
on purpose. Here such an image answers only when the test says (the operator's
wall-clock deadlines lifted, so the hold does not depend on how fast the machine is);
kopf is stood in for by its event loop on a thread (``KopfLoop``) and a pool of 4
threads for its sync handlers.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import copy
import datetime
import functools
import logging
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import kopf
import kubernetes.client
import pytest
from kopf._cogs.aiokits.aioenums import FlagSetter

from slopilot.operator import handlers, pod_admin, pod_syncs
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.daemon_ends import DaemonEnds
from slopilot.operator.handlers import repair
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.spec import parse_spec
from slopilot.operator.tuning_pool import TuningPool
from tests.operator.operator_support import (
    Cluster,
    KopfLoop,
    add_pod,
    kopf_loop,
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
# The handlers, called as kopf calls them (kopf's types ask for every kwarg it passes).
sync_untuned_pods: Any = handlers.sync_untuned_pods
reconcile_spec: Any = handlers.reconcile_spec
delete_deleted_studies: Any = handlers.delete_deleted_studies
stop_pod_syncs: Any = handlers.stop_pod_syncs


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
    """Namespaces of LLMDeployments, each reconciled once, with one pod each; kopf's
    handlers called as kopf calls them (``kopf_``'s loop, ``threads`` for sync ones)."""

    def __init__(self, kube: RunningEmulator, client: kubernetes.client.ApiClient,
                 kopf_: KopfLoop, threads: ThreadPoolExecutor, *namespaces: str) -> None:
        self.client, self.kopf, self.threads = client, kopf_, threads
        first = with_namespaces(kube, Cluster(client, namespaces[0]), *namespaces)
        self.policy, self.mint = OperatorPolicy(), operator_mint(first)
        self.pods: dict[tuple[str, str], PodStandIn] = {}
        # kopf's memo: what the startup sets, shared by every CR through its own copy.
        self.memo = kopf.Memo(kube=first.kube, tokens=self.mint, policy=self.policy,
                              locks=LockTable(), pod_syncs=kopf_.pool,
                              handler_threads=threads, tuning_pool=TuningPool(2, 2),
                              tuning_daemons=DaemonEnds())
        self._memos: dict[str, kopf.Memo] = {}
        self._stoppers: dict[tuple[str, str], FlagSetter[Any]] = {}

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
        self.pods[(namespace, name)] = pod
        add_pod(cluster, name, 0, pod.port)
        return pod

    def synced(self, namespace: str, name: str) -> bool:
        """Whether the CR's pod runs its spec's config."""
        want = parse_spec(self.cluster(namespace).get(name)).engine.to_dict()
        pod = self.pods[(namespace, name)]
        with pod.lock:
            return pod.config is not None and {k: pod.config.get(k) for k in want} == want

    def memo_of(self, namespace: str, name: str) -> kopf.Memo:
        """The CR's memo, as kopf keeps one per object (a copy of the operator's)."""
        return self._memos.setdefault(f"{namespace}/{name}", copy.copy(self.memo))

    def timer(self, namespace: str, name: str) -> Future[None]:
        """A run of the config-sync timer of ``namespace/name``, as kopf awaits it on its
        loop, with the stop flag ``stop`` sets."""
        stopper: FlagSetter[Any] = FlagSetter()
        self._stoppers[(namespace, name)] = stopper
        out: Future[None] = self.kopf.run(sync_untuned_pods(
            body=self.cluster(namespace).get(name), memo=self.memo_of(namespace, name),
            logger=log, stopped=stopper.async_waiter))
        return out

    def stop(self, namespace: str, name: str, reason: kopf.DaemonStoppingReason) -> None:
        """kopf stopping the CR's timer (its CR deleted, say)."""
        self.kopf.loop.call_soon_threadsafe(functools.partial(
            self._stoppers[(namespace, name)].set, reason=reason))

    def close(self) -> None:
        for pod in self.pods.values():
            pod.close()
        self.memo.tuning_pool.shutdown()


@pytest.fixture
def lifted_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's wall-clock bounds on a pod's answers out of the way: the slow image
    holds each request until the test lets it answer."""
    far = 4 * HANG_GUARD_S
    monkeypatch.setattr(pod_syncs, "HTTP_TIMEOUT_S", far)
    monkeypatch.setattr(pod_admin, "POD_ANSWER_DEADLINE_S", far)
    monkeypatch.setattr(pod_admin, "SYNC_DEADLINE_S", far)
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: None)  # kopf's context


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The Warning events of syncs that wait (kopf's posting needs its running context):
    (CR name, message)."""
    out: list[tuple[str, str]] = []
    monkeypatch.setattr(pod_syncs, "post_sync_waits", lambda body, why: out.append(
        (body["metadata"]["name"], why)))
    return out


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    """kopf's pool of handler threads, small."""
    with ThreadPoolExecutor(max_workers=KOPF_THREADS, thread_name_prefix="kopf") as out:
        yield out


def pods_condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.condition("PodsConfigured", name)


def test_a_seventh_namespace_syncs_while_six_namespaces_pods_hold_every_slot(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, threads: ThreadPoolExecutor) -> None:
    """Six namespaces of two CRs each, their pods answering only when the test says, hold
    every pod sync the operator runs at once; a seventh namespace's sync was refused, and
    at each of its intervals found the slots retaken by the slow ones, which retry as
    soon as they end: its edits never reached its pods. It waits for a slot now, and the
    first one freed is its, not the retrying slow CR's."""
    from slopilot.operator.pod_sync_pool import SYNC_THREADS, SYNCS_PER_NAMESPACE

    slow_ns = [f"team-{i}" for i in range(1, 7)]
    held = {(ns, f"chat-{i}"): SlowImage() for ns in slow_ns for i in range(SYNCS_PER_NAMESPACE)}
    assert len(held) == SYNC_THREADS
    with kopf_loop() as kopf_:
        tenants = Tenants(kube, kube_client, kopf_, threads, *slow_ns, "team-7")
        try:
            for key, slow in held.items():
                tenants.deployment(*key, slow=slow)
            tenants.deployment("team-7", "chat", running={"token_budget": 512})
            syncs = {key: tenants.timer(*key) for key in held}
            wait_for(lambda: sum(s.held() for s in held.values()) == SYNC_THREADS,
                     what="every slow CR's sync waiting on its pod")
            seventh = tenants.timer("team-7", "chat")
            wait_for(lambda: kopf_.pool.waiting() == 1, what="the seventh's sync waiting")
            # One slow pod answers; its CR's timer asks again at once, its pod as slow as
            # ever (a hostile tenant's retries come as fast as the slots free).
            first = ("team-1", "chat-0")
            held[first].answer.set()
            wait_for(syncs[first].done, what="the first slow sync, its pod answered")
            held[first] = SlowImage()
            tenants.pods[first].on_request = held[first]
            syncs[first] = tenants.timer(*first)
            wait_for(seventh.done, what="the seventh namespace's sync")
            seventh.result()
            assert tenants.synced("team-7", "chat"), "the seventh namespace's pod was not synced"
            wait_for(lambda: held[first].held() == 1, what="the retry, on the slot freed next")
            assert not any(syncs[key].done() for key in held if key != first)
        finally:
            for slow in held.values():
                slow.answer.set()
            kopf_.settled()
            tenants.close()


def test_a_namespaces_slow_pods_hold_its_share_and_its_waits_are_said(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, threads: ThreadPoolExecutor,
        monkeypatch: pytest.MonkeyPatch, warned: list[tuple[str, str]]) -> None:
    """team-a's syncs, each waiting on its slow pod, hold one slot (its share here), and
    its other CRs' syncs wait for it, on no thread; team-b's sync runs meanwhile, and no
    sync holds a kopf thread. A sync that waits past ``SYNC_WAIT_SAID_S`` (0 here: at
    once) says so in its PodsConfigured condition, until it runs and says what it
    found."""
    monkeypatch.setattr(pod_syncs, "SYNC_WAIT_SAID_S", 0.0)
    names = [f"chat-{i}" for i in range(KOPF_THREADS)]
    slow = {name: SlowImage() for name in names}
    with kopf_loop(threads=3, per_namespace=1) as kopf_:
        tenants = Tenants(kube, kube_client, kopf_, threads, "team-a", "team-b")
        try:
            for name in names:
                tenants.deployment("team-a", name, slow=slow[name])
            tenants.deployment("team-b", "chat", running={"token_budget": 512})
            a_syncs = [tenants.timer("team-a", name) for name in names]
            wait_for(lambda: sum(s.held() for s in slow.values()) == 1
                     and kopf_.pool.waiting() == len(names) - 1,
                     what="one of team-a's syncs on its pod, the others waiting")
            b_sync = tenants.timer("team-b", "chat")
            wait_for(b_sync.done, what="team-b's sync, beside team-a's")
            b_sync.result()
            assert tenants.synced("team-b", "chat")
            # kopf's threads: every one free for the handlers that talk to the API alone.
            team_a = tenants.cluster("team-a")
            repairs = [threads.submit(repair, team_a.get(name), tenants.memo_of("team-a", name),
                                      log) for name in names]
            for done in repairs:
                done.result(timeout=HANG_GUARD_S)
            waiting = [name for name in names if not slow[name].held()]

            def said() -> list[dict[str, Any] | None]:
                return [pods_condition(team_a, name) for name in waiting]

            wait_for(lambda: all(c is not None and c["reason"] == "SyncDeferred"
                                 for c in said()), what="each waiting sync said")
            assert all(c is not None and c["status"] == "Unknown"
                       and "SYNCS_PER_NAMESPACE" in c["message"] for c in said()), said()
            assert sorted(name for name, _ in warned) == sorted(waiting)  # once each
            assert all("namespace team-a runs the most syncs one namespace runs" in why
                       for _, why in warned), warned
            assert all(not s.done() for s in a_syncs)
            for image in slow.values():
                image.answer.set()
            for sync in a_syncs:
                sync.result(timeout=HANG_GUARD_S)
            after = [pods_condition(team_a, name) for name in names]
            assert all(c is not None and c["reason"] == "PodsConfigured" for c in after), after
        finally:
            for image in slow.values():
                image.answer.set()
            kopf_.settled()
            tenants.close()


def test_a_crs_slow_sync_holds_no_lock_its_repairs_and_reconciles_wait_for(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, threads: ThreadPoolExecutor) -> None:
    """A sync held the CR's lock while it waited on the pods, and every drift repair of
    its owned objects (an event each: its Deployment's status as its pods go ready and
    not, say) and its reconcile waited for that lock, each on a kopf thread. The sync
    now holds the lock only around its writes, as the daemon's does; the reconcile's
    own sync, asked while the timer's is under way, is run by it once more after it,
    reading the edit, and the reconcile does not wait for it."""
    slow = SlowImage()
    with kopf_loop() as kopf_:
        tenants = Tenants(kube, kube_client, kopf_, threads, "team-a")
        try:
            pod = tenants.deployment("team-a", "chat", slow=slow)
            team_a = tenants.cluster("team-a")
            timer = tenants.timer("team-a", "chat")
            wait_for(lambda: slow.held() == 1, what="the timer's sync waiting on the pod")
            memo = tenants.memo_of("team-a", "chat")
            fixed = threads.submit(repair, team_a.get("chat"), memo, log)
            wait_for(fixed.done, what="the drift repair, while the sync waits on the pod")
            fixed.result()
            edited = team_a.patch("chat", {"spec": {"engine": {"tokenBudget": 4096}}})
            reconciled = threads.submit(reconcile_spec, body=edited, memo=memo,
                                        logger=log)
            wait_for(reconciled.done, what="the reconcile, while the sync waits on the pod")
            reconciled.result()
            kopf_.flushed()  # its ask on the loop, before the pod answers
            assert slow.held() == 1 and not timer.done() and kopf_.pool.syncs() == 1
            slow.answer.set()
            wait_for(timer.done, what="the timer's sync and its second run")
            timer.result()
            with pod.lock:
                assert pod.config is not None and pod.config["token_budget"] == 4096
            assert kopf_.pool.syncs() == 0
        finally:
            slow.answer.set()
            kopf_.settled()
            tenants.close()


def test_a_crs_sync_waiting_when_it_is_deleted_runs_nothing(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, threads: ThreadPoolExecutor,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer's sync waiting for a slot, kopf stops the timer (the CR deleted): the
    timer ends, its sync is withdrawn and the next namespace's takes the slot. A sync a
    reconcile asked, which no timer awaits, is withdrawn by the deletion handler."""
    deleted: list[str] = []
    monkeypatch.setattr(handlers, "delete_studies", lambda body, policy, **_: deleted.append(
        body["metadata"]["name"]))
    slow = SlowImage()
    with kopf_loop(threads=1, per_namespace=1) as kopf_:
        tenants = Tenants(kube, kube_client, kopf_, threads, "team-a", "team-b", "team-c",
                          "team-d")
        try:
            tenants.deployment("team-a", "chat", slow=slow)
            for ns in ("team-b", "team-c", "team-d"):
                tenants.deployment(ns, "chat", running={"token_budget": 512})
            holder = tenants.timer("team-a", "chat")
            wait_for(lambda: slow.held() == 1, what="team-a's sync on its pod")
            gone = tenants.timer("team-b", "chat")
            wait_for(lambda: kopf_.pool.waiting() == 1, what="team-b's sync waiting")
            team_d = tenants.cluster("team-d")
            threads.submit(reconcile_spec, body=team_d.get("chat"),
                           memo=tenants.memo_of("team-d", "chat"),
                           logger=log).result(timeout=HANG_GUARD_S)
            wait_for(lambda: kopf_.pool.waiting() == 2, what="team-d's asked sync waiting")
            after = tenants.timer("team-c", "chat")
            wait_for(lambda: kopf_.pool.waiting() == 3, what="team-c's sync waiting")
            tenants.stop("team-b", "chat", kopf.DaemonStoppingReason.RESOURCE_DELETED)
            wait_for(gone.done, what="team-b's timer, stopped")
            gone.result()
            kopf_.run(delete_deleted_studies(body=team_d.get("chat"),
                                             memo=tenants.memo_of("team-d", "chat"),
                                             logger=log,
                                             runtime=datetime.timedelta(0))
                     ).result(timeout=HANG_GUARD_S)
            assert deleted == ["chat"] and kopf_.pool.waiting() == 1
            slow.answer.set()
            wait_for(after.done, what="team-c's sync, on the slot")
            after.result()
            kopf_.settled()
            assert tenants.synced("team-c", "chat")
            for ns in ("team-b", "team-d"):
                assert tenants.pods[(ns, "chat")].gets == 0, ns
                assert not tenants.synced(ns, "chat"), ns
            holder.result(timeout=HANG_GUARD_S)
        finally:
            slow.answer.set()
            kopf_.settled()
            tenants.close()


def test_the_operators_exit_withdraws_the_waiting_syncs(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        lifted_deadlines: None, threads: ThreadPoolExecutor) -> None:
    """kopf's cleanup at exit: the syncs that wait end with nothing run, their timers
    with them; the one under way runs to its end (its deadline bounds it)."""
    slow = SlowImage()
    with kopf_loop(threads=1, per_namespace=1) as kopf_:
        tenants = Tenants(kube, kube_client, kopf_, threads, "team-a", "team-b")
        try:
            tenants.deployment("team-a", "chat", slow=slow)
            tenants.deployment("team-b", "chat", running={"token_budget": 512})
            holder = tenants.timer("team-a", "chat")
            wait_for(lambda: slow.held() == 1, what="team-a's sync on its pod")
            waiting = tenants.timer("team-b", "chat")
            wait_for(lambda: kopf_.pool.waiting() == 1, what="team-b's sync waiting")
            kopf_.run(stop_pod_syncs(memo=tenants.memo)).result(timeout=HANG_GUARD_S)
            waiting.result(timeout=HANG_GUARD_S)
            assert not holder.done() and kopf_.pool.waiting() == 0
            slow.answer.set()
            holder.result(timeout=HANG_GUARD_S)
            assert tenants.synced("team-a", "chat")
            assert tenants.pods[("team-b", "chat")].gets == 0
        finally:
            slow.answer.set()
            kopf_.settled()
            tenants.close()


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_pods_not_checked_are_said_so_only_where_a_sync_would_say_otherwise(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        backend: str) -> None:
    """No sync writes PodsConfigured for vLLM (no admin API): a deferral written there
    would stay for good. Written once per generation, as any change of meaning."""
    from slopilot.operator.pods_status import record_sync_deferred

    cluster = with_namespaces(kube, Cluster(kube_client, "team-a"), "team-a")
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
