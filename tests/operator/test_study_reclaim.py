"""The studies of CRs gone while no operator ran are reclaimed from every storage the
operator wrote a study in, directory storages included, and from no other.

The reclaim at start visited only the allow-list's entries that name one database: a
``sqlite:////dir/*`` (or ``*``) entry names no file, and the operator opens no file it
was not asked to. So a study in a directory storage whose CR was deleted while the
operator was down stayed there for good. The operator now records each (namespace,
storage) as it opens a study there, in a ConfigMap per namespace in its own namespace
(study_ledger.py), and the reclaim visits exactly those, each judged by the policy
again, and deletes there only the orphans of the namespace that recorded it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.daemon import study_name
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.study_ledger import LEDGER, entry_key, forget, read_ledger, record
from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving
from slopilot.tuner.study.storage import open_study
from tests.operator.operator_support import (
    NS,
    Cluster,
    daemon_loop,
    llmd,
    operator_mint,
    with_namespaces,
)
from tests.operator.standins import build_study_controller
from tests.support import waits
from tests.support.kube_server import RunningEmulator

OTHER = "team-b"


def names(storage: str) -> list[str]:
    return sorted(optuna.get_all_study_names(storage))


@pytest.fixture
def policy(directory_policy: OperatorPolicy) -> OperatorPolicy:
    return directory_policy


@pytest.fixture
def ready(kube: RunningEmulator, cluster: Cluster) -> Cluster:
    return with_namespaces(kube, cluster, OTHER)


def tuned(cluster: Cluster, policy: OperatorPolicy, storage: str | None,
          monkeypatch: pytest.MonkeyPatch, *, namespace: str = NS,
          name: str = "chat") -> dict[str, Any]:
    """A CR whose daemon stepped once: its controller built, its study opened (in
    ``storage``; None: the field not written) as the operator opens it."""
    tuning = {} if storage is None else {"storage": storage}
    body = llmd(name, prometheus={"url": "http://127.0.0.1:9"}, tuning=tuning)
    body["metadata"]["namespace"] = namespace
    body = cluster.kube.create(API_VERSION, PLURAL, namespace, body)
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    loop = daemon_loop(cluster, body, monkeypatch, factory=build_study_controller,
                       policy=policy, namespace=namespace)
    assert loop.step() is True and loop.controller is not None, "no controller built"
    loop.close()
    return body


def gone_while_down(cluster: Cluster, body: dict[str, Any]) -> None:
    """The CR deleted with no operator running (its finalizer stripped by hand)."""
    meta = body["metadata"]
    cluster.kube.patch(API_VERSION, PLURAL, meta["namespace"], meta["name"],
                       {"metadata": {"finalizers": []}})
    cluster.kube.request(
        "DELETE", f"/apis/{API_VERSION}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}")
    assert cluster.kube.get(API_VERSION, PLURAL, meta["namespace"], meta["name"]) is None


def study_of(body: dict[str, Any]) -> str:
    meta = body["metadata"]
    return study_name(meta["namespace"], meta["name"], meta["uid"])


def test_a_study_in_a_directory_storage_is_reclaimed_after_its_cr_went_unseen(
        ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The case that leaked: ``sqlite:////dir/*``, a CR deleted while the operator was
    down, the operator starts. By uid: the CR made again under the name, here and in
    another namespace, keeps its study."""
    storage = f"sqlite:///{studies}/team-a.db"
    gone = tuned(ready, policy, storage, monkeypatch)
    gone_while_down(ready, gone)
    again = tuned(ready, policy, storage, monkeypatch)
    there = tuned(ready, policy, storage, monkeypatch, namespace=OTHER)
    assert len(names(storage)) == 3

    done = reclaim_orphaned_studies(ready.kube, policy, serving([NS, OTHER]))
    assert done.deleted == [study_of(gone)]
    assert names(storage) == sorted([study_of(again), study_of(there)])


def test_no_file_the_operator_did_not_record_is_opened(
        ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reason the directory was skipped stays: a file of it no CR named is never
    opened (its orphan-shaped study stays), and a recorded file since removed is not
    made again by the question."""
    unasked = f"sqlite:///{studies}/team-c.db"
    stranger = study_name(NS, "chat", "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e")
    open_study(unasked, stranger)
    removed = studies / "gone.db"
    gone = tuned(ready, policy, f"sqlite:///{removed}", monkeypatch)
    gone_while_down(ready, gone)
    removed.unlink()

    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == [] and not done.skipped
    assert names(unasked) == [stranger]
    assert not removed.exists()
    # Nothing of the namespace is left in the removed file: its entry leaves the record.
    assert [e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
            ] == []


def test_a_tenant_naming_another_teams_file_reclaims_only_its_own_namespace_there(
        ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """team-a names team-b's file (the directory entry allows it): the record says so,
    and the reclaim deletes there only team-a's orphans. team-b's orphan-shaped study,
    which no team-b CR of this operator's recorded, stays."""
    theirs = f"sqlite:///{studies}/team-b.db"
    their_study = study_name(OTHER, "chat", "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e")
    open_study(theirs, their_study)
    mine = tuned(ready, policy, theirs, monkeypatch)
    gone_while_down(ready, mine)

    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == [study_of(mine)]
    assert names(theirs) == [their_study]


def forge(cluster: Cluster, data: dict[str, str]) -> None:
    found = cluster.kube.get("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, LEDGER)
    if found is None:
        cluster.kube.create("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": LEDGER},
            "data": data})
    else:
        cluster.kube.patch("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, LEDGER,
                           {"data": data})


def entry(namespace: str, storage: str) -> dict[str, str]:
    return {entry_key(namespace, storage): json.dumps(
        {"namespace": namespace, "storage": storage, "recorded": "2026-01-01T00:00:00Z"})}


def test_a_forged_record_opens_nothing_the_policy_would_not_open_for_a_cr(
        ready: Cluster, policy: OperatorPolicy, studies: Path, tmp_path: Path) -> None:
    """Whoever writes the record (it is in the operator's namespace, but a ConfigMap is
    easier to come by than the operator's account) makes it open no database the policy
    refuses, see no password, and create no file."""
    outside = f"sqlite:///{tmp_path / 'outside.db'}"
    orphan = study_name(NS, "chat", "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e")
    open_study(outside, orphan)
    ghost = studies / "ghost.db"
    forge(ready, {
        **entry(NS, outside),  # off the allow-list
        **entry(NS, "postgresql://optuna:hunter2@db.other-team:5432/studies"),
        **entry(NS, f"sqlite:///{ghost}"),  # allowed, absent: not made by the question
        "garbage": "not json",
        entry_key(NS, f"sqlite:///{studies}/a.db"): json.dumps(  # key and value disagree
            {"namespace": NS, "storage": outside}),
    })
    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == []
    assert names(outside) == [orphan]
    assert not ghost.exists()
    report = "\n".join(done.skipped)
    assert "hunter2" not in report
    assert "not on the operator's storage allow-list" in report
    assert "holds a password" in report
    assert f"{LEDGER} entry garbage: not one the operator wrote" in report
    assert f"{LEDGER} entry {entry_key(NS, f'sqlite:///{studies}/a.db')}: not one" in report


class SilentDatabase:
    """A TCP server that accepts and never answers: a database that hangs every
    client (a half-dead PostgreSQL, a black-holing proxy)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = threading.Event()
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            while True:
                client, _ = self.server.accept()
                self.clients.append(client)
                self.accepted.set()
        except OSError:  # closed
            return

    def close(self) -> None:
        self.server.close()
        for client in self.clients:  # the hung client gets an error, and its thread ends
            client.close()


@pytest.fixture
def silent() -> Iterator[SilentDatabase]:
    db = SilentDatabase()
    yield db
    db.close()


def test_a_storage_that_never_answers_does_not_hold_up_the_reclaim(
        ready: Cluster, studies: Path, silent: SilentDatabase,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each storage is visited on a thread of its own, the whole within a budget: the
    silent one is reported once it ran out, the others' orphans are deleted."""
    policy = OperatorPolicy(allowed_storage=(f"sqlite:///{studies}/*", "*"))
    hung = f"postgresql+psycopg2://optuna@127.0.0.1:{silent.port}/studies"
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, hung)
    healthy = f"sqlite:///{studies}/team-a.db"
    gone = tuned(ready, policy, healthy, monkeypatch)
    gone_while_down(ready, gone)

    def budget(storage: str, ended: threading.Event, seconds: float) -> bool:
        """The budget runs out for the silent storage once it holds a connection (it
        hangs then, for good); every other is waited for."""
        if storage == hung:
            waits.wait_for(lambda: silent.accepted.is_set() or ended.is_set(),
                           "the visit to connect to the silent database")
            assert not ended.is_set(), "the visit ended: it never hung"
            return False
        return ended.wait(waits.HANG_GUARD_S)

    done = reclaim_orphaned_studies(ready.kube, policy, serving(None), wait=budget)
    assert done.deleted == [study_of(gone)]
    (line,) = done.skipped
    assert line.startswith(f"{hung}: no answer in ")
    # A storage not visited to its end stays on the record, for the next start.
    assert hung in [e.storage for e in
                    read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries]


def test_the_record_keeps_what_a_live_cr_names_and_drops_the_rest(
        ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = (f"sqlite:///{studies}/{f}" for f in ("a.db", "b.db"))
    live = tuned(ready, policy, a, monkeypatch, name="live")
    gone = tuned(ready, policy, b, monkeypatch, name="gone")
    gone_while_down(ready, gone)
    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == [study_of(gone)]
    assert done.forgotten == [f"{NS} {b}"]
    assert [e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
            ] == [a]
    assert names(a) == [study_of(live)]


def test_an_entry_recorded_during_the_reclaim_is_not_dropped(ready: Cluster) -> None:
    """The reclaim read the record, then a build recorded (namespace, storage) again and
    is opening its study there: the drop, conditional on the version read, does nothing."""
    storage, other = "sqlite:////var/lib/slopilot/study.db", "sqlite:////var/lib/o.db"
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, other)  # kept: forgetting patches
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, storage)
    (read,) = read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).shards
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, storage)  # a build meanwhile
    assert not forget(ready.kube, DEFAULT_OPERATOR_NAMESPACE, read, [entry_key(NS, storage)])
    assert sorted(e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE)
                  .entries) == sorted([storage, other])


def test_a_build_whose_record_fails_opens_no_study(
        kube: RunningEmulator, ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Opened first, a study whose record then failed would be one the reclaim never
    visits: the build fails instead (the Tuning condition says why), and the next step
    records it and opens it."""
    storage = f"sqlite:///{studies}/team-a.db"
    body = ready.kube.create(API_VERSION, PLURAL, NS, llmd(
        prometheus={"url": "http://127.0.0.1:9"}, tuning={"storage": storage}))
    assert reconcile(ready.kube, body, policy=policy, mint=operator_mint(ready)).valid
    loop = daemon_loop(ready, body, monkeypatch, factory=build_study_controller,
                       policy=policy)
    kube.emulator.fail("POST", "configmaps", status=500)
    assert loop.step() is True and loop.controller is None
    assert not (studies / "team-a.db").exists()
    tuning = ready.condition("Tuning")
    assert tuning is not None and "operator's record of study storages" in tuning["message"]
    assert loop.step() is True and loop.controller is not None
    loop.close()
    assert names(storage) == [study_of(body)]


def test_a_namespace_keeps_its_newest_entries_and_no_other_namespaces(
        ready: Cluster) -> None:
    from slopilot.operator.study_ledger import MAX_PER_NAMESPACE

    theirs = "sqlite:////data/studies/theirs.db"
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, OTHER, theirs, now="2026-01-01T00:00:00")
    mine = [f"sqlite:////data/studies/{i}.db" for i in range(MAX_PER_NAMESPACE + 2)]
    for i, storage in enumerate(mine):
        record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, storage,
               now=f"2026-01-02T00:00:{i:02d}")
    kept = read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
    assert sorted(e.storage for e in kept if e.namespace == NS) == sorted(
        mine[-MAX_PER_NAMESPACE:])
    assert [e.storage for e in kept if e.namespace == OTHER] == [theirs]
