"""One tenant's events of objects it labels as the operator's cost other tenants' drift
repairs a bounded share, never its backlog.

The watch of the owned kinds selects ``app.kubernetes.io/managed-by=slopilot-operator``,
a label any tenant can put on its own objects, with a controller reference to its own
CR (whose uid it can read). Each such event was a full reconcile under the CR's lock on
kopf's handler threads, which every tenant shares: events of one CR ran one at a time,
the other threads blocked on its lock, and another tenant's repair waited for all of
them (0.02 s alone; 2.4 s behind 100 events, 10 s behind 400, at some 40 a second
without end). Now an event of an object the CR does not render reaches no reconcile, a
CR's events are coalesced into one repair running and one to come, and the repairs run
on a share of kopf's threads, a namespace's on a share of that, in turn
(drift_repairs.py).

kopf is stood in for by its event loop on a thread (``KopfLoop``) and a pool of
``HANDLER_THREADS`` for its sync handlers; a handler runs as kopf runs one. Each
reconcile is counted, and a held namespace's wait at a gate the test opens one at a
time: what is asserted is how many of one tenant's reconciles ran before another's
repair, never how long anything took.
"""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator import handlers
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.drift_repairs import REPAIRS, REPAIRS_PER_NAMESPACE, DriftRepairs
from slopilot.operator.owned_meta import MANAGED, owner_reference
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import desired_objects, owned_names, reconcile
from slopilot.operator.settings import HANDLER_THREADS
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import (
    Cluster,
    KopfLoop,
    kopf_loop,
    llmd,
    operator_mint,
    wait_for,
    with_namespaces,
)
from tests.operator.test_spec_clients import grants
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

log = logging.getLogger("test")
FLOOD = 100
"""Events of one tenant's objects, as the reviewer's run queued them."""
ENGINE = ("v1", "configmaps")
SERVICE = ("v1", "services")
DRIFT = {"spec": {"selector": {"slopilot.dev/llmdeployment": "other"}}}


class Reconciles:
    """``handlers.reconcile``, counted: each call's ``namespace/name`` as it starts and
    ends. A call of a ``held`` namespace waits at a gate (``arrived`` counts those) until
    let through, one per ``let_one``, or all once ``open``."""

    def __init__(self, real: Callable[..., Any], held: tuple[str, ...] = ()) -> None:
        self.real, self.held = real, set(held)
        self.cond = threading.Condition()
        self.started: list[str] = []
        self.ended: list[str] = []
        self.arrived = 0
        self._permits = 0
        self._opened = False

    def __call__(self, kube: Any, body: Mapping[str, Any], **kwargs: Any) -> Any:
        namespace = body["metadata"]["namespace"]
        key = f"{namespace}/{body['metadata']['name']}"
        with self.cond:
            self.started.append(key)
            if namespace in self.held:
                self.arrived += 1
                self.cond.notify_all()
                assert self.cond.wait_for(lambda: self._opened or self._permits > 0,
                                          HANG_GUARD_S), "the test never let it through"
                if not self._opened:
                    self._permits -= 1
        try:
            return self.real(kube, body, **kwargs)
        finally:
            with self.cond:
                self.ended.append(key)
                self.cond.notify_all()

    def let_one(self) -> None:
        with self.cond:
            self._permits += 1
            self.cond.notify_all()

    def open(self) -> None:
        with self.cond:
            self._opened = True
            self.cond.notify_all()

    def of(self, namespace: str, seen: list[str] | None = None) -> list[str]:
        with self.cond:
            return [k for k in (self.started if seen is None else seen)
                    if k.startswith(f"{namespace}/")]


@contextlib.contextmanager
def held_team_a(monkeypatch: pytest.MonkeyPatch, threads: ThreadPoolExecutor,
                tenant: Cluster, repairs: DriftRepairs
                ) -> Iterator[tuple[Reconciles, KopfLoop, DriftRepairs, Kopf]]:
    """kopf standing in with ``repairs`` on ``threads`` for ``tenant``'s events, every
    reconcile counted and team-a's held at the gate; on the way out the gate opened and
    every repair let end."""
    counted = Reconciles(handlers.reconcile, held=("team-a",))
    monkeypatch.setattr(handlers, "reconcile", counted)
    with kopf_loop() as loop:
        stand_in = Kopf(loop, threads, tenant, repairs)
        try:
            yield counted, loop, repairs, stand_in
        finally:
            counted.open()
            stand_in.settled()


class Kopf:
    """kopf as the drift handlers meet it: its loop (``loop``), its handler threads, the
    operator's memo (its drift repairs on those threads), and a handler run as kopf runs
    one: a coroutine function awaited on the loop, any other on a thread."""

    def __init__(self, loop: KopfLoop, threads: ThreadPoolExecutor, cluster: Cluster,
                 repairs: DriftRepairs) -> None:
        self.loop, self.threads = loop, threads
        self.memo = kopf.Memo(kube=cluster.kube, locks=LockTable(), policy=OperatorPolicy(),
                              tokens=operator_mint(cluster), handler_threads=threads,
                              pod_syncs=loop.pool, drift_repairs=repairs)
        self.handled: list[Future[Any]] = []

    def handle(self, handler: Callable[..., Any], **kwargs: Any) -> Future[Any]:
        if inspect.iscoroutinefunction(handler):
            out: Future[Any] = self.loop.run(handler(**kwargs))
        else:
            out = self.threads.submit(handler, **kwargs)
        self.handled.append(out)
        return out

    def event(self, obj: Mapping[str, Any] | None, type_: str = "MODIFIED") -> Future[Any]:
        """kopf's drift handler at an event of ``obj`` (as the watch delivered it)."""
        assert obj is not None
        return self.handle(handlers.repair_drift, event={"type": type_, "object": obj},
                           body=obj, memo=self.memo, logger=log)

    def settled(self) -> None:
        """Every event handled, every repair they asked ended."""
        for done in self.handled:
            done.result(HANG_GUARD_S)
        self.loop.run(self.memo.drift_repairs.settled()).result(HANG_GUARD_S)


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The events a repair posts (kopf's posting needs its running context): (CR,
    reason)."""
    out: list[tuple[str, str]] = []
    monkeypatch.setattr(handlers, "post_events", lambda body, outcome, *, reason: out.append(
        (f"{body['metadata']['namespace']}/{body['metadata']['name']}", reason)))
    return out


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    """kopf's pool of handler threads, as many as the operator sets."""
    with ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="kopf") as out:
        yield out


def tenants(kube: RunningEmulator, client: kubernetes.client.ApiClient,
            crs: Mapping[str, int]) -> dict[str, Cluster]:
    """Namespaces of CRs, each reconciled once: ``crs`` maps a namespace to how many
    (``chat`` for one, else ``chat-0``, ``chat-1``, ...)."""
    out = {ns: Cluster(client, ns) for ns in crs}
    first = with_namespaces(kube, next(iter(out.values())), *crs)
    policy, mint = OperatorPolicy(), operator_mint(first)
    for ns, count in crs.items():
        for name in names(count):
            body = llmd(name)
            body["metadata"]["namespace"] = ns
            assert reconcile(out[ns].kube, out[ns].create(body), policy=policy,
                             mint=mint).valid
    return out


def names(count: int) -> list[str]:
    return ["chat"] if count == 1 else [f"chat-{i}" for i in range(count)]


def edited(cluster: Cluster, api: tuple[str, str], name: str, patch: Mapping[str, Any]
           ) -> dict[str, Any]:
    """An owned object edited by hand, as the watch delivers it then."""
    out = cluster.kube.patch(*api, cluster.namespace, name, patch)
    assert out is not None
    return out


def decoy(cluster: Cluster, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """A tenant's own ConfigMap labelled as the operator's, its controller reference its
    CR's, exactly as the operator writes one (the uid is the tenant's to read)."""
    return cluster.kube.create("v1", "configmaps", cluster.namespace, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": cluster.namespace, "labels": dict(MANAGED),
                     "ownerReferences": [owner_reference(owner)]},
        "data": {"n": name}})


def b_or_next(counted: Reconciles, lets: int) -> bool:
    """team-b's repair ended, or team-a's next reconcile is at the gate after ``lets``
    were let through: whichever the repairs' turn brings."""
    with counted.cond:
        return "team-b/chat" in counted.ended or counted.arrived > lets


def test_the_numbers_leave_kopfs_threads_to_its_other_handlers() -> None:
    assert 1 <= REPAIRS_PER_NAMESPACE <= REPAIRS // 4  # one namespace: a quarter at most
    assert REPAIRS < HANDLER_THREADS  # spec reconciles, deletions, timers: the rest


def test_the_operations_guide_says_the_numbers() -> None:
    from tests.docs.test_doc_references import ROOT

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    for said in (f"at most {REPAIRS} of kopf's {HANDLER_THREADS} threads (`REPAIRS`",
                 f"at most {REPAIRS_PER_NAMESPACE} of one namespace's "
                 "(`REPAIRS_PER_NAMESPACE`)"):
        assert said in text, said


@pytest.mark.parametrize("spec", [{"clients": grants()}, {"backend": "vllm"}],
                         ids=["builtin-clients", "vllm"])
def test_the_owned_names_are_every_name_the_render_gives(spec: dict[str, Any]) -> None:
    body = llmd("chat", **spec)
    body["metadata"].update(namespace="team-a", uid="u-1")
    parsed = parse_spec(body)
    rendered = set()
    for monitoring in (True, False):
        objects = desired_objects(body, parsed, replicas=1, monitoring=monitoring,
                                  operator_namespace="slopilot-system")
        rendered |= {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert rendered == owned_names("chat")


def test_decoys_named_otherwise_reach_no_reconcile_and_hold_up_no_other_tenant(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
        posted: list[tuple[str, str]]) -> None:
    """The reviewer's run: a hundred of team-a's own ConfigMaps, managed-by label and a
    controller reference to its CR, each edited, then team-b's Service edited. Each of
    team-a's events was a reconcile of its CR, and team-b's repair ran behind them all;
    none of them is one of the CR's objects, so none reaches a reconcile."""
    teams = tenants(kube, kube_client, {"team-a": 1, "team-b": 1})
    a, b = teams["team-a"], teams["team-b"]
    owner = a.get("chat")
    decoys = [decoy(a, f"decoy-{i}", owner) for i in range(FLOOD)]
    counted = Reconciles(handlers.reconcile)
    monkeypatch.setattr(handlers, "reconcile", counted)
    with kopf_loop() as loop:
        stand_in = Kopf(loop, threads, a, DriftRepairs(executor=threads))
        for obj in decoys:
            stand_in.event(obj)
        stand_in.event(edited(b, SERVICE, "chat", DRIFT))
        stand_in.settled()
    assert counted.started == ["team-b/chat"], counted.of("team-a")[:3]
    assert b.owned(*SERVICE, "chat")["spec"]["selector"]["slopilot.dev/llmdeployment"] \
        == "chat"
    assert posted == [("team-b/chat", "DriftRepaired")]


def test_a_tenants_flood_delays_anothers_repair_by_one_turn_of_its_reconciles(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
        posted: list[tuple[str, str]]) -> None:
    """One repair at a time here, so that a turn shows: team-a's three CRs, a hundred
    events of their real objects (the engine ConfigMap each tenant may edit), its
    reconciles held at the gate; team-b's repair asked behind them runs after two of
    team-a's reconciles (the one under way, and the one whose namespace's turn came
    first), not after a hundred. The CR asked again while under way is run once more,
    at the back of the turn."""
    teams = tenants(kube, kube_client, {"team-a": 3, "team-b": 1})
    a, b = teams["team-a"], teams["team-b"]
    engine = {name: a.owned(*ENGINE, f"{name}-engine") for name in names(3)}
    with held_team_a(monkeypatch, threads, a, DriftRepairs(1, 1, executor=threads)) as (
            counted, loop, _, stand_in):
        for i in range(FLOOD // 2):
            stand_in.event(engine[f"chat-{i % 3}"])
        wait_for(lambda: counted.arrived >= 1, what="team-a's first repair at the gate")
        for i in range(FLOOD // 2):  # chat-0's, while its repair is under way
            stand_in.event(engine[f"chat-{i % 3}"])
        stand_in.event(edited(b, SERVICE, "chat", DRIFT))
        loop.flushed()  # every event handled that the loop was handed
        lets = 0
        while "team-b/chat" not in counted.ended and lets <= 2:
            counted.let_one()
            lets += 1
            wait_for(functools.partial(b_or_next, counted, lets),
                     what="team-b's repair, or team-a's next at the gate")
        a_before_b = counted.of("team-a", counted.ended[:counted.ended.index(
            "team-b/chat")] if "team-b/chat" in counted.ended else counted.ended)
        assert "team-b/chat" in counted.ended, \
            f"team-b's repair not run after {len(a_before_b)} of team-a's reconciles"
        assert a_before_b == ["team-a/chat-0", "team-a/chat-1"]
    assert counted.started == ["team-a/chat-0", "team-a/chat-1", "team-b/chat",
                               "team-a/chat-2", "team-a/chat-0"]
    assert b.owned(*SERVICE, "chat")["spec"]["selector"]["slopilot.dev/llmdeployment"] \
        == "chat"


def test_a_tenants_flood_holds_its_namespaces_share_and_no_more(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
        posted: list[tuple[str, str]]) -> None:
    """The operator's numbers: team-a's flood over more CRs than its share holds
    ``REPAIRS_PER_NAMESPACE`` of kopf's threads, its repairs held; team-b's repair runs
    meanwhile, none of team-a's reconciles ended."""
    count = REPAIRS_PER_NAMESPACE + 1
    teams = tenants(kube, kube_client, {"team-a": count, "team-b": 1})
    a, b = teams["team-a"], teams["team-b"]
    engine = {name: a.owned(*ENGINE, f"{name}-engine") for name in names(count)}
    with held_team_a(monkeypatch, threads, a, DriftRepairs(executor=threads)) as (
            counted, loop, repairs, stand_in):
        for i in range(FLOOD // 2):
            stand_in.event(engine[f"chat-{i % count}"])
        wait_for(lambda: counted.arrived == REPAIRS_PER_NAMESPACE,
                 what="team-a's share of repairs at the gate")
        for i in range(FLOOD // 2):  # while its share's repairs are under way
            stand_in.event(engine[f"chat-{i % count}"])
        stand_in.event(edited(b, SERVICE, "chat", DRIFT))
        wait_for(lambda: "team-b/chat" in counted.ended,
                 what="team-b's repair, team-a's held")
        assert counted.of("team-a", counted.ended) == []
        assert counted.arrived == REPAIRS_PER_NAMESPACE
        loop.flushed()
        assert repairs.waiting() == 1  # team-a's third CR, on no thread
    # Each of team-a's CRs: the repair under way when more events came, and once more.
    assert sorted(counted.of("team-a")) == sorted(
        [f"team-a/chat-{i}" for i in range(REPAIRS_PER_NAMESPACE)] * 2
        + [f"team-a/chat-{REPAIRS_PER_NAMESPACE}"])


def test_a_crs_events_coalesce_into_one_repair_running_and_one_to_come(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
        posted: list[tuple[str, str]]) -> None:
    teams = tenants(kube, kube_client, {"team-a": 1})
    a = teams["team-a"]
    with held_team_a(monkeypatch, threads, a, DriftRepairs(executor=threads)) as (
            counted, loop, repairs, stand_in):
        stand_in.event(a.owned(*ENGINE, "chat-engine"))
        wait_for(lambda: counted.arrived == 1, what="the first repair at the gate")
        # Edited while the repair runs (it may have read the Service already).
        stand_in.event(edited(a, SERVICE, "chat", DRIFT))
        for _ in range(FLOOD):
            stand_in.event(a.owned(*ENGINE, "chat-engine"))
        loop.flushed()
        assert (repairs.repairs(), repairs.running(), repairs.waiting()) == (1, 1, 0)
    assert counted.started == ["team-a/chat"] * 2
    assert a.owned(*SERVICE, "chat")["spec"]["selector"]["slopilot.dev/llmdeployment"] \
        == "chat"


def test_real_drift_is_still_repaired_and_said(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, posted: list[tuple[str, str]]) -> None:
    """An edited Service and a deleted engine ConfigMap, each an event: both put back,
    the Reconciled condition says so, and the timer's look finds nothing more to do."""
    teams = tenants(kube, kube_client, {"team-a": 1})
    a = teams["team-a"]
    engine = a.owned(*ENGINE, "chat-engine")
    a.kube.delete(*ENGINE, "team-a", "chat-engine")
    with kopf_loop() as loop:
        stand_in = Kopf(loop, threads, a, DriftRepairs(executor=threads))
        stand_in.event(edited(a, SERVICE, "chat", DRIFT))
        stand_in.event(engine, "DELETED")
        stand_in.settled()
        assert a.owned(*SERVICE, "chat")["spec"]["selector"][
            "slopilot.dev/llmdeployment"] == "chat"
        assert a.owned(*ENGINE, "chat-engine") is not None
        reconciled = a.condition("Reconciled", "chat")
        assert reconciled is not None and reconciled["reason"] == "DriftRepaired", reconciled
        before = len(posted)
        stand_in.handle(handlers.retry_drift_repair, body=a.get("chat"), memo=stand_in.memo,
                        logger=log)
        stand_in.settled()
        assert len(posted) == before


def test_the_operators_exit_withdraws_the_repairs_that_wait() -> None:
    """kopf's cleanup: a repair waiting for a slot ends with nothing run; the one under
    way runs to its end; none asked after runs."""
    async def main() -> None:
        repairs = DriftRepairs(1, 1)
        entered, release = asyncio.Event(), threading.Event()
        loop = asyncio.get_running_loop()
        ran: list[str] = []

        def held() -> None:
            loop.call_soon_threadsafe(entered.set)
            assert release.wait(HANG_GUARD_S)
            ran.append("held")

        first = repairs.ask("team-a", "chat", held)
        await asyncio.wait_for(entered.wait(), HANG_GUARD_S)
        waiting = repairs.ask("team-b", "chat", lambda: ran.append("waiting"))
        await asyncio.sleep(0)  # the waiting one's first step: it waits for the slot
        assert repairs.waiting() == 1
        repairs.shutdown()
        await asyncio.wait_for(asyncio.shield(waiting.done), HANG_GUARD_S)
        late = repairs.ask("team-c", "chat", lambda: ran.append("late"))
        assert late.done.done() and not first.done.done()
        release.set()
        await asyncio.wait_for(asyncio.shield(first.done), HANG_GUARD_S)
        assert ran == ["held"] and repairs.repairs() == 0

    asyncio.run(main())
