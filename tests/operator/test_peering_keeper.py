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
import socket
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
from slopilot.operator.kubeapi import ApiError, Kube
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


def run_keeper(kube_client: kubernetes.client.ApiClient, served: Any, stop: threading.Event,
               **kwargs: Any) -> threading.Thread:
    keeper = threading.Thread(target=keep_peerings, args=(
        Kube(kube_client), PEERING, served, stop), kwargs=kwargs, daemon=True)
    keeper.start()
    return keeper


def watches_started(kube: RunningEmulator, plural: str) -> int:
    return sum(1 for watched, _ in list(kube.emulator.watches) if watched == plural)


def test_a_peering_object_deleted_by_hand_is_made_again_while_it_runs(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        peering_crds: None) -> None:
    """Its namespace stays: kopf does not pause, but its replicas there stop seeing each
    other until the object is back (before, until the operator's next start)."""
    cluster = Cluster(kube_client)
    kube.install(namespace("team-a"))
    stop = threading.Event()
    keeper = run_keeper(kube_client, serving(["team-a"]), stop)
    try:
        first = wait_for(lambda: peering_in(cluster, "team-a"), what="team-a's")
        cluster.kube.delete("kopf.dev/v1", "kopfpeerings", "team-a", PEERING)
        again = wait_for(lambda: peering_in(cluster, "team-a"), what="team-a's again")
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
    finally:
        stop.set()
    wait_for(lambda: not keeper.is_alive(), what="the keeper's end")
    assert creates_in(kube, "team-a") == ["POST", "POST"]


def test_the_keeper_ends_when_the_operator_stops_its_watches_open(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        peering_crds: None) -> None:
    """A daemon thread held by a watch until its timeout outlived the operator's stop by
    up to a minute; here the watches would last an hour: only a stop that closes them
    ends the keeper."""
    cluster = Cluster(kube_client)
    kube.install(namespace("team-a"))
    stop = threading.Event()
    keeper = run_keeper(kube_client, serving(["team-a"]), stop, resync_s=3600)
    wait_for(lambda: peering_in(cluster, "team-a"), what="team-a's")
    wait_for(lambda: watches_started(kube, "namespaces"), what="its watch of namespaces")
    stop.set()
    wait_for(lambda: not keeper.is_alive(), what="the keeper's end")


def test_a_namespace_left_out_at_the_start_is_served_once_created_again(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        peering_crds: None) -> None:
    """Terminating at the start, team-b was left out of kopf's patterns (served without a
    KopfPeering it would pause every namespace); once it is gone, a team-b created again
    is a new namespace: served again, its KopfPeering made, without a restart."""
    from kopf._cogs.structs.references import Insights
    from kopf._core.reactor.observation import revise_namespaces

    from slopilot.operator.served_patterns import ServedPatterns

    cluster = Cluster(kube_client)
    kube.install(namespace("team-a"), namespace("team-b", finalizers=["test/hold"]))
    cluster.core.delete_namespace("team-b")
    patterns = ServedPatterns(["team-a", "team-b"],
                              {"team-b": "is being deleted (Terminating)"})
    assert list(patterns) == ["team-a"]
    stop = threading.Event()
    keeper = run_keeper(kube_client, patterns.served, stop, left_out=patterns)
    try:
        wait_for(lambda: peering_in(cluster, "team-a"), what="team-a's")
        assert list(patterns) == ["team-a"]  # still the old, Terminating team-b
        cluster.core.patch_namespace("team-b", {"metadata": {"finalizers": None}})
        wait_for(lambda: list(patterns) == ["team-a", "team-b"], what="team-b served again")
        cluster.core.create_namespace(namespace("team-b"))
        wait_for(lambda: peering_in(cluster, "team-b"), what="the new team-b's")
    finally:
        stop.set()
    # kopf reads the very collection at each namespace event: the new team-b is served.
    insights = Insights()
    revise_namespaces(insights=insights, namespaces=patterns,
                      raw_events=[{"type": "ADDED", "object": namespace("team-b")}])
    assert insights.namespaces == {"team-b"}
    wait_for(lambda: not keeper.is_alive(), what="the keeper's end")


class Refusing:
    """A Kube whose creates of peering objects are refused (no RoleBinding yet)."""

    def __init__(self) -> None:
        self.creates: list[float] = []
        self.now = 0.0
        self.refuse = True
        self.error = ApiError(403, "Forbidden", "kopfpeerings is forbidden")

    def get(self, *_args: Any) -> None:
        return None

    def create(self, *_args: Any) -> dict[str, Any]:
        self.creates.append(self.now)
        if self.refuse:
            raise self.error
        return {}


def test_a_refused_create_is_retried_with_a_capped_exponential_backoff() -> None:
    from slopilot.operator.peering_needs import RETRY_CAP_S, RETRY_FIRST_S, PeeringKeeper

    kube = Refusing()
    keeper = PeeringKeeper(kube, PEERING, serving(["team-*"]),  # type: ignore[arg-type]
                           clock=lambda: kube.now)
    team_a = namespace("team-a", uid="u1")
    keeper.listed([team_a])
    assert kube.creates == [0.0]
    # Each listing (and each due check) before the retry's time tries nothing.
    expected, at, delay = [0.0], 0.0, RETRY_FIRST_S
    for _ in range(12):
        kube.now = at + delay - 0.5
        keeper.listed([team_a])
        keeper.retry_due()
        assert kube.creates == expected
        kube.now = at + delay
        keeper.retry_due()
        expected.append(kube.now)
        assert kube.creates == expected
        at, delay = kube.now, min(delay * 2, RETRY_CAP_S)
    assert delay == RETRY_CAP_S
    kube.refuse = False  # its RoleBinding made
    kube.now = at + delay
    keeper.listed([team_a])
    assert kube.creates[-1] == kube.now
    kube.now += 10 * RETRY_CAP_S
    keeper.retry_due()
    keeper.listed([team_a])
    assert len(kube.creates) == len(expected) + 1  # made: nothing more to try


def test_a_peering_object_deleted_with_its_namespace_is_not_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    """The namespace controller deletes it with everything else, the namespace's watch
    event perhaps seen after its own: neither warns that kopf would pause."""
    from slopilot.operator.peering_needs import PeeringKeeper

    kube = Refusing()
    kube.refuse = False
    keeper = PeeringKeeper(kube, PEERING, serving(["team-*"]))  # type: ignore[arg-type]
    keeper.seen(namespace("team-a", uid="u1"))
    kube.refuse = True  # the API server's answer in a Terminating namespace
    kube.error = ApiError(403, "Forbidden", "x", details={
        "causes": [{"reason": "NamespaceTerminating"}]})
    with caplog.at_level(logging.INFO):
        keeper.peering_gone("team-a")  # before the namespace's own event
        keeper.seen(namespace("team-a", uid="u1",
                              deletionTimestamp="2026-01-01T00:00:00Z"), "MODIFIED")
        keeper.retry_due()
    assert "pauses every namespace" not in caplog.text, caplog.text
    assert "its KopfPeering went with it" in caplog.text
    assert len(kube.creates) == 2


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


def test_a_namespace_left_out_at_the_start_is_served_by_kopf_once_created_again(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, tmp_path: Path,
        peering_crds: None, operators: list[Operator]) -> None:
    """The operator's own process: kopf was given the live patterns, and reads them when
    the new team-b comes (before, team-b waited for the operator's next start)."""
    served_by(kube, "team-a")
    kube.install(namespace("team-b", finalizers=["test/hold"]))
    kube.emulator.restrict(TOKEN, USER, granted_to(namespaced(("team-a", "team-b")),
                                                   DEFAULT_OPERATOR_NAMESPACE, ACCOUNT))
    cluster = Cluster(kube_client, namespace="team-b")
    cluster.core.delete_namespace("team-b")  # Terminating at the start
    # A glob's Terminating namespace is found by the listing at the start (the emulator
    # does not refuse creates in one, as the API server's admission does).
    operators.append(op := start_operator(kube, tmp_path, "--namespace", "team-*"))
    wait_for(lambda: "namespace team-b is being deleted (Terminating): not served until "
             "it is gone" in op.output(), what="team-b left out")
    cluster.core.patch_namespace("team-b", {"metadata": {"finalizers": None}})
    wait_for(lambda: "namespace team-b is gone: served again" in op.output(),
             what="team-b put back")
    cluster.core.create_namespace(namespace("team-b"))
    body = llmd(tuning={"enabled": False})
    body["metadata"]["namespace"] = "team-b"
    cluster.create(body)
    wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
             what="the new team-b's Deployment")
    assert peering_in(cluster, "team-b") is not None
    assert op.stop() == 0, op.output()


def test_a_peering_object_deleted_again_and_again_is_made_again_with_a_backoff() -> None:
    """A tenant allowed to delete its namespace's KopfPeering deletes it as soon as it is
    made: the first is made again at once, each further one within a short time after a
    backoff doubling up to a cap (each was a GET and a POST at once), and after a calm
    the next is made again at once."""
    from slopilot.operator.peering_needs import (
        REMAKE_CALM_S,
        RETRY_CAP_S,
        RETRY_FIRST_S,
        PeeringKeeper,
    )

    kube = Refusing()
    kube.refuse = False
    keeper = PeeringKeeper(kube, PEERING, serving(["team-*"]),  # type: ignore[arg-type]
                           clock=lambda: kube.now)
    keeper.seen(namespace("team-a", uid="u1"))
    keeper.peering_gone("team-a")
    assert kube.creates == [0.0, 0.0]  # the first deletion: made again at once
    for _ in range(1000):
        keeper.peering_gone("team-a")
        keeper.retry_due()
    assert kube.creates == [0.0, 0.0]  # not yet: deleted again at once, after a backoff
    expected, delay = [0.0, 0.0], RETRY_FIRST_S
    for _ in range(8):
        kube.now += delay - 0.5
        keeper.retry_due()
        keeper.seen(namespace("team-a", uid="u1"), "MODIFIED")
        assert kube.creates == expected
        kube.now += 0.5
        keeper.retry_due()
        expected.append(kube.now)
        assert kube.creates == expected
        keeper.peering_gone("team-a")  # the tenant deletes it again at once
        delay = min(delay * 2, RETRY_CAP_S)
    assert delay == RETRY_CAP_S
    # Left alone a while after it was last made, the next deletion is made good at once.
    kube.now += delay
    keeper.retry_due()
    expected.append(kube.now)
    kube.now += REMAKE_CALM_S
    keeper.peering_gone("team-a")
    expected.append(kube.now)
    assert kube.creates == expected


class Stop(threading.Event):
    """An operator's stop whose waits return at once, each recorded; set after ``limit``
    of them (or by the test)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self.limit = limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


class Listing:
    """A Kube whose LISTs answer at once, counted; a stop set after ``limit`` of them (a
    keeper that never waits between LISTs ends there)."""

    def __init__(self, stop: threading.Event, limit: int = 50,
                 items: list[dict[str, Any]] | None = None) -> None:
        self.stop, self.limit, self.items = stop, limit, items or []
        self.lists = 0
        self.creates: list[str] = []

    def request(self, method: str, path: str, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        if self.lists >= self.limit:
            self.stop.set()
        return {"metadata": {"resourceVersion": "1"}, "items": self.items}

    def get(self, *_args: Any) -> None:
        return None

    def create(self, _api_version: str, _plural: str, ns: str, _body: Any) -> dict[str, Any]:
        self.creates.append(ns)
        return {}


def watches_that(monkeypatch: pytest.MonkeyPatch, clock: list[float],
                 ends: list[str]) -> None:
    """Each watch the keeper opens ends as the next of ``ends`` says, at once: "closed"
    (200, no event), "410" (its version expired), "event" (one event first), "long"
    (closed after 60 s on ``clock``); the last repeats."""
    from slopilot.operator import peering_keeper

    def watch(*_args: Any, **_kwargs: Any) -> Iterator[dict[str, Any]]:
        end = ends.pop(0) if len(ends) > 1 else ends[0]
        if end == "410":
            raise ApiError(410, "Gone", "too old resource version")
        if end == "event":
            yield {"type": "DELETED", "object": namespace("other", namespace="other")}
        if end == "long":
            clock[0] += 60.0

    monkeypatch.setattr(peering_keeper, "watch_events", watch)


JOBS = [pytest.param("_namespaces", id="namespaces"), pytest.param("_peerings", id="peerings")]


@pytest.mark.parametrize("end", ["closed", "410"])
@pytest.mark.parametrize("job", JOBS)
def test_a_watch_ending_at_once_is_listed_again_after_a_backoff(
        monkeypatch: pytest.MonkeyPatch, job: str, end: str) -> None:
    """An API server (or a proxy) ending each watch at once had the keeper LIST the whole
    cluster's namespaces (or KopfPeerings) again at once: ~100,000 LISTs a second. As
    client-go's reflector, it waits 1 s doubling up to 30 s, on the operator's stop."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    clock = [0.0]
    stop = Stop(limit=8)
    kube = Listing(stop)
    watches_that(monkeypatch, clock, [end])
    keeper = PeeringKeeper(kube, PEERING, serving([]),  # type: ignore[arg-type]
                           clock=lambda: clock[0])
    getattr(peering_keeper, job)(keeper, stop, Open(), 60)
    assert stop.waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert kube.lists == 8


@pytest.mark.parametrize("job", JOBS)
def test_a_watch_that_lived_long_or_told_events_resets_the_backoff(
        monkeypatch: pytest.MonkeyPatch, job: str) -> None:
    from slopilot.operator import peering_keeper
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    clock = [0.0]
    stop = Stop(limit=5)
    kube = Listing(stop)
    watches_that(monkeypatch, clock,
                 ["closed", "closed", "event", "closed", "410", "long", "closed"])
    keeper = PeeringKeeper(kube, PEERING, serving([]),  # type: ignore[arg-type]
                           clock=lambda: clock[0])
    getattr(peering_keeper, job)(keeper, stop, Open(), 60)
    assert stop.waits == [1.0, 2.0, 1.0, 2.0, 1.0]
    assert kube.lists == 7


@pytest.mark.parametrize("job", JOBS)
def test_a_listing_answered_after_the_stop_is_acted_on_no_more(job: str) -> None:
    """A LIST in flight is not cut by the stop (up to REQUEST_TIMEOUT_S): its thread,
    left behind, makes nothing of its answer."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    stop = Stop(limit=1)
    kube = Listing(stop, limit=1, items=[namespace("team-a", uid="u1")]
                   if job == "_namespaces" else [])
    keeper = PeeringKeeper(kube, PEERING, serving(["team-*"]),  # type: ignore[arg-type]
                           stop=stop)
    if job == "_peerings":  # made before; the stop comes while the LIST is in flight
        keeper.seen(namespace("team-a", uid="u1"))
        assert kube.creates == ["team-a"]
        kube.creates.clear()
    getattr(peering_keeper, job)(keeper, stop, Open(), 60)
    assert kube.creates == []
    keeper.retry_due()
    keeper.seen(namespace("team-b", uid="u2"))
    assert kube.creates == []


class Joined:
    """A keeper's thread that does not end: each join takes its whole timeout."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.timeouts = clock, list[float | None]()

    def join(self, timeout: float | None = None) -> None:
        self.timeouts.append(timeout)
        self.clock[0] += timeout or 0.0


def test_the_keepers_threads_are_joined_within_one_deadline() -> None:
    """Joined one after another, JOIN_S each, a stop while LISTs hung waited for them all
    in turn (10 s where the docstring said at once)."""
    from slopilot.operator.peering_keeper import JOIN_S, join_within

    clock = [0.0]
    threads = [Joined(clock) for _ in range(3)]
    join_within(threads, JOIN_S, clock=lambda: clock[0])  # type: ignore[arg-type]
    assert [t.timeouts for t in threads] == [[JOIN_S], [0.0], [0.0]]


class Scripted(Listing):
    """A Kube whose LISTs answer as the next of ``answers`` says (the last repeats): an
    ApiError raised, or else a listing with no items."""

    def __init__(self, stop: threading.Event, answers: list[ApiError | None]) -> None:
        super().__init__(stop)
        self.answers = answers

    def request(self, method: str, path: str, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is not None:
            raise answer
        return {"metadata": {"resourceVersion": str(self.lists)}, "items": []}


FORBIDDEN = ApiError(403, "Forbidden", "is forbidden")


def test_a_list_of_namespaces_refused_is_warned_of_again_once_let_through_and_refused(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Without it, no namespace created again or matched by a glob gets its KopfPeering:
    warned of when the refusal starts, and again when it starts again after a watch was
    let through (tried again each MAX_RETRY_S meanwhile)."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.api_reach import MAX_RETRY_S
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    stop = Stop(limit=4)
    kube = Scripted(stop, [FORBIDDEN, FORBIDDEN, None, FORBIDDEN])
    clock = [0.0]  # the watch's backoff on the script's clock, not on real seconds
    watches_that(monkeypatch, clock, ["closed"])
    keeper = PeeringKeeper(kube, PEERING, serving([]),  # type: ignore[arg-type]
                           clock=lambda: clock[0])
    with caplog.at_level(logging.INFO):
        peering_keeper._namespaces(keeper, stop, Open(), 45)
    assert stop.waits == [MAX_RETRY_S, MAX_RETRY_S, 1.0, MAX_RETRY_S]
    assert caplog.text.count("may not list or watch namespaces") == 2, caplog.text
    assert caplog.text.count("may list and watch namespaces again") == 1, caplog.text
    assert not keeper.recheck


def test_a_list_of_peerings_refused_turns_to_rechecks_warned_of_once_until_listed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An install from before the grant: each listing of namespaces GETs each served
    one's object instead, the LIST of peerings tried again each resync; warned of once
    (until a watch is let through and refused again), not each minute."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    stop = Stop(limit=5)
    kube = Scripted(stop, [FORBIDDEN, FORBIDDEN, None, FORBIDDEN, FORBIDDEN])
    clock = [0.0]  # the watch's backoff on the script's clock, not on real seconds
    watches_that(monkeypatch, clock, ["closed"])
    keeper = PeeringKeeper(kube, PEERING, serving([]),  # type: ignore[arg-type]
                           clock=lambda: clock[0])
    rechecks: list[bool] = []
    stop_wait = stop.wait

    def wait(timeout: float | None = None) -> bool:
        rechecks.append(keeper.recheck)
        return stop_wait(timeout)

    monkeypatch.setattr(stop, "wait", wait)
    with caplog.at_level(logging.WARNING):
        peering_keeper._peerings(keeper, stop, Open(), 45)
    assert stop.waits == [45, 45, 1.0, 45, 45]
    assert rechecks == [True, True, False, True, True]
    assert caplog.text.count("may not list or watch KopfPeerings") == 2, caplog.text


class Clocked(Stop):
    """A ``Stop`` whose each wait moves ``clock`` on by its timeout."""

    def __init__(self, limit: int, clock: list[float]) -> None:
        super().__init__(limit)
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock[0] += timeout or 0.0
        return super().wait(timeout)


def test_a_list_of_namespaces_refused_for_hours_is_warned_of_at_its_start_then_hourly(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Warned of at each try, a refusal that lasted filled the operator's log with the
    same line each 30 s (~2,900 a day), burying everything else. Now: at its start (with
    the rule to add), again once an hour while it lasts, and said when let through;
    tried again each MAX_RETRY_S all along."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.api_reach import MAX_RETRY_S
    from slopilot.operator.peering_keeper import REWARN_S, Open
    from slopilot.operator.peering_needs import PeeringKeeper

    clock = [0.0]
    tries = int(2 * REWARN_S / MAX_RETRY_S)  # two hours refused
    stop = Clocked(tries + 2, clock)
    kube = Scripted(stop, [*[FORBIDDEN] * tries, None, FORBIDDEN])
    watches_that(monkeypatch, clock, ["closed"])
    keeper = PeeringKeeper(kube, PEERING, serving([]),  # type: ignore[arg-type]
                           clock=lambda: clock[0])
    warned: list[tuple[float, str]] = []
    handler = logging.Handler()
    handler.emit = lambda r: warned.append((clock[0], r.getMessage()))  # type: ignore
    handler.setLevel(logging.INFO)
    peering_keeper.log.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO):
            peering_keeper._namespaces(keeper, stop, Open(), 45)
    finally:
        peering_keeper.log.removeHandler(handler)
    assert stop.waits == [*[MAX_RETRY_S] * tries, 1.0, MAX_RETRY_S]
    assert kube.lists == tries + 2
    assert [at for at, _ in warned] == [0.0, REWARN_S, 2 * REWARN_S, 2 * REWARN_S + 1]
    start, again, through, restart = (m for _, m in warned)
    assert "may not list or watch namespaces" in start
    assert "resources: [namespaces], verbs: [list, watch]" in start
    assert "still may not list or watch namespaces" in again
    assert f"{int(REWARN_S / MAX_RETRY_S) + 1} tries refused in 60 min" in again
    assert "may list and watch namespaces again" in through
    assert "may not list or watch namespaces" in restart and "still" not in restart
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 3, caplog.text


def test_peerings_listed_but_not_watched_warn_once_and_keep_rechecking(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """RBAC granting list but not watch on kopfpeerings: each LIST let through counted
    as the refusal's end, so the "warned once" warning came each resync, and each LIST
    switched the GET rechecks off until the watch was refused again (a listing of
    namespaces in between skipped them). Rechecks stay on until a watch is let
    through."""
    from slopilot.operator import peering_keeper
    from slopilot.operator.peering_keeper import Open
    from slopilot.operator.peering_needs import PeeringKeeper

    stop = Stop(limit=5)
    kube = Listing(stop)
    keeper = PeeringKeeper(kube, PEERING, serving([]))  # type: ignore[arg-type]
    rechecks: list[bool] = []

    def refused_watch(*_args: Any, **_kwargs: Any) -> Iterator[dict[str, Any]]:
        rechecks.append(keeper.recheck)  # as a listing of namespaces now would see it
        raise FORBIDDEN
        yield  # a generator, as watch_events

    monkeypatch.setattr(peering_keeper, "watch_events", refused_watch)
    with caplog.at_level(logging.WARNING):
        peering_keeper._peerings(keeper, stop, Open(), 45)
    assert stop.waits == [45] * 5 and kube.lists == 5
    assert rechecks == [False, True, True, True, True]
    assert caplog.text.count("may not list or watch KopfPeerings") == 1, caplog.text


class Silent:
    """An API server that takes each request and never answers it (one whose priority
    and fairness queue holds a LIST, a load balancer gone quiet): each connection held
    open, its request read, until ``close``."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.requests: list[bytes] = []
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, name="silent-api", daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(conn)
            self.requests.append(conn.recv(65536))

    def close(self) -> None:
        # A close alone leaves a blocked accept taking connections (Linux): shut first.
        self.server.shutdown(socket.SHUT_RDWR)
        self.thread.join()
        self.server.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    if server.thread.is_alive():
        server.close()


def test_a_stop_while_a_list_is_unanswered_ends_the_keepers_threads(
        monkeypatch: pytest.MonkeyPatch, silent: Silent) -> None:
    """A LIST in flight at the stop ran to its request timeout (30 s), its thread with it:
    the operator's stop (and each test's) waited for it. The timeout is an hour here, so
    only a stop that frees the LIST's wait ends the keeper's threads; the LIST's timeout
    is not shortened for it (a slow but sound LIST of a busy cluster would fail)."""
    from slopilot.operator import kubeapi

    monkeypatch.setattr(kubeapi, "REQUEST_TIMEOUT_S", 3600.0)
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=silent.host))
    stop = threading.Event()
    keeper = run_keeper(client, serving(["team-*"]), stop)
    wait_for(lambda: sum(b"GET /api" in r for r in silent.requests) == 2,
             what="the LISTs of namespaces and of KopfPeerings, unanswered")
    stop.set()
    guard = 20.0  # far under the LIST's hour, far over a prompt stop
    keeper.join(guard)
    assert not keeper.is_alive()
    names = {f"peering-keeper-{what}" for what in ("namespaces", "peerings", "retries")}
    for thread in threading.enumerate():
        if thread.name in names:
            thread.join(guard)
            assert not thread.is_alive(), f"{thread.name} outlived the stop"
    # Each LIST left behind ends on its own once its connection does, making nothing of it.
    lists = [t for t in threading.enumerate() if t.name.startswith("peering-keeper-")]
    assert {t.name for t in lists} <= {f"{name}-list" for name in names}
    silent.close()
    for thread in lists:
        thread.join(guard)
        assert not thread.is_alive(), f"{thread.name} outlived its connection"
