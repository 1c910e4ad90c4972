"""One namespace's record of study storages never makes another namespace's fail.

The operator records (namespace, storage) before it opens a study (study_ledger.py), and
a build whose record fails opens none. The record was one ConfigMap for every
namespace, and a ConfigMap holds at most 1 MiB of data: 64 namespaces each naming
``MAX_PER_NAMESPACE`` storages of ``MAX_STORAGE_URL`` characters (allowed URLs, e.g. a
``*`` entry's databases with a long query) filled it, and from then on no other
namespace's CR got a study. The emulator refuses a ConfigMap over 1 MiB as the API
server does (kube_validation.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.daemon import study_name
from slopilot.operator.knobs import MAX_STORAGE_URL
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.study_ledger import (
    LEDGER,
    MAX_CONFIGMAP_BYTES,
    MAX_PER_NAMESPACE,
    SHARD_LABEL,
    WORST_SHARD_BYTES,
    entry_key,
    forget,
    read_ledger,
    record,
    shard_name,
)
from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving
from slopilot.tuner.study.storage import open_study
from tests.operator.operator_support import NS, Cluster, with_namespaces
from tests.operator.test_study_reclaim import gone_while_down, names, study_of, tuned
from tests.support.kube_server import RunningEmulator
from tests.support.kube_validation import configmap_size

CROWD = [f"tenant-{i:02d}" for i in range(64)]
LATECOMER = "team-late"
OTHER = "team-b"
UID = "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e"


def long_url(namespace: str, i: int) -> str:
    """A database URL of ``MAX_STORAGE_URL`` characters, one per (namespace, i)."""
    head = f"postgresql+psycopg2://optuna@db.shared:5432/{namespace}_{i}?application_name="
    return head + "x" * (MAX_STORAGE_URL - len(head))


@pytest.fixture
def ready(kube: RunningEmulator, cluster: Cluster) -> Cluster:
    return with_namespaces(kube, cluster, *CROWD, LATECOMER, OTHER)


@pytest.fixture
def policy(directory_policy: OperatorPolicy) -> OperatorPolicy:
    return directory_policy


def configmap(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.kube.get("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, name)


def value(namespace: str, storage: str) -> dict[str, str]:
    """An entry as the operator writes it."""
    return {entry_key(namespace, storage): json.dumps(
        {"namespace": namespace, "storage": storage, "recorded": "2026-01-01T00:00:00Z"})}


def make(cluster: Cluster, name: str, data: dict[str, str],
         labels: dict[str, str] | None = None) -> None:
    cluster.kube.create("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}}, "data": data})


def test_namespaces_that_fill_their_records_never_stop_another_namespaces(
        ready: Cluster) -> None:
    refused: list[str] = []
    for namespace in CROWD:
        for i in range(MAX_PER_NAMESPACE):
            try:
                record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, namespace,
                       long_url(namespace, i))
            except ApiError as exc:
                refused.append(f"{namespace} {i}: {exc}")
    # The latecomer's own storage, as long as the crowd's: a record of one namespace
    # that the others' entries left no room for.
    storage = long_url(LATECOMER, 0)
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, LATECOMER, storage)
    assert refused == []  # and none of the crowd's own is refused for its neighbours
    entries = read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
    assert sorted((e.namespace, e.storage) for e in entries) == sorted(
        [(LATECOMER, storage)] + [(n, long_url(n, i)) for n in CROWD
                                  for i in range(MAX_PER_NAMESPACE)])


def test_one_namespaces_record_at_its_worst_fits_a_configmap(ready: Cluster) -> None:
    """Its bound: ``MAX_PER_NAMESPACE`` storages of ``MAX_STORAGE_URL`` characters, each
    one JSON writes as 12 bytes, and the longest namespace name."""
    assert WORST_SHARD_BYTES < MAX_CONFIGMAP_BYTES
    namespace = "n" * 63
    ready.kube.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": namespace}})
    for i in range(MAX_PER_NAMESPACE + 1):
        head = f"sqlite:////data/{i}/"
        record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, namespace,
               head + "\U0001F600" * (MAX_STORAGE_URL - len(head)))
    found = configmap(ready, shard_name(namespace))
    assert found is not None and len(found["data"]) == MAX_PER_NAMESPACE
    assert configmap_size(found) <= WORST_SHARD_BYTES


def test_the_reclaim_finds_every_namespaces_record_and_deletes_the_emptied(
        ready: Cluster, policy: OperatorPolicy, studies: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each namespace's orphan, from its own record; a record left with no entry goes
    (the namespace's CRs are all gone), one a live CR still names stays."""
    shared = f"sqlite:///{studies}/shared.db"
    gone = [tuned(ready, policy, shared, monkeypatch, namespace=ns, name="gone")
            for ns in (NS, OTHER, LATECOMER)]
    live = tuned(ready, policy, f"sqlite:///{studies}/live.db", monkeypatch, name="live")
    for body in gone:
        gone_while_down(ready, body)
    assert sorted({e.shard for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE)
                   .entries}) == sorted(shard_name(n) for n in (NS, OTHER, LATECOMER))

    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert sorted(done.deleted) == sorted(study_of(b) for b in gone) and not done.skipped
    assert names(shared) == []
    assert sorted(done.forgotten) == sorted(f"{n} {shared}" for n in (NS, OTHER, LATECOMER))
    assert configmap(ready, shard_name(OTHER)) is None
    assert configmap(ready, shard_name(LATECOMER)) is None
    assert [e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
            ] == [f"sqlite:///{studies}/live.db"]
    assert names(f"sqlite:///{studies}/live.db") == [study_of(live)]


def test_the_previous_versions_single_record_is_still_read_until_it_empties(
        ready: Cluster, policy: OperatorPolicy, studies: Path) -> None:
    """An upgrade loses no record: the one ConfigMap of every namespace, as the previous
    version wrote it, is visited as before; its entries leave as each is done with, and
    the ConfigMap goes with the last."""
    a, b = (f"sqlite:///{studies}/{f}" for f in ("a.db", "b.db"))
    orphans = [study_name(NS, "chat", UID), study_name(OTHER, "chat", UID)]
    open_study(a, orphans[0])
    open_study(b, orphans[1])
    make(ready, LEDGER, {**value(NS, a), **value(OTHER, b)},
         {"app.kubernetes.io/name": "slopilot-operator", "app.kubernetes.io/part-of": "slopilot"})
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, a)  # on both: dropped from both

    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert sorted(done.deleted) == sorted(orphans) and not done.skipped
    assert configmap(ready, LEDGER) is None
    assert configmap(ready, shard_name(NS)) is None
    assert read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries == []


def test_a_configmap_passed_off_as_a_namespaces_record_is_not_trusted(
        ready: Cluster, policy: OperatorPolicy, studies: Path) -> None:
    """team-b's orphan-shaped study sits in a file no team-b CR of this operator named.
    Put on record as team-b's by a ConfigMap named for another namespace, labelled for
    team-b under another name, or as an entry of team-b on default's own record, it is
    not opened for team-b: its study stays."""
    theirs = f"sqlite:///{studies}/team-b.db"
    orphan = study_name(OTHER, "chat", UID)
    open_study(theirs, orphan)
    make(ready, shard_name(NS), value(OTHER, theirs), {SHARD_LABEL: OTHER})
    make(ready, "look-alike", value(OTHER, theirs), {SHARD_LABEL: OTHER})
    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == [] and names(theirs) == [orphan]
    report = "\n".join(done.skipped)
    for name in (shard_name(NS), "look-alike"):
        assert f"the record ConfigMap {name}: labelled as the record of a namespace it is " \
            "not named for" in report

    ready.kube.patch("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, shard_name(NS),
                     {"metadata": {"labels": {SHARD_LABEL: NS}}})
    done = reclaim_orphaned_studies(ready.kube, policy, serving(None))
    assert done.deleted == [] and names(theirs) == [orphan]
    assert f"{shard_name(NS)} entry {entry_key(OTHER, theirs)}: not one the operator " \
        "wrote" in "\n".join(done.skipped)

    # default's own record, written: the stranger goes, the labels are its own.
    mine = f"sqlite:///{studies}/default.db"
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, mine)
    found = configmap(ready, shard_name(NS))
    assert found is not None and list(found["data"]) == [entry_key(NS, mine)]
    assert found["metadata"]["labels"][SHARD_LABEL] == NS


class Interleaved(Kube):
    """``Kube`` that runs ``between`` once, after its next read of a ConfigMap: what
    another thread does between a record's read and its write."""

    def __init__(self, kube: Kube, between: Callable[[], None]) -> None:
        super().__init__(kube.client)
        self.between: Callable[[], None] | None = between

    def get(self, api_version: str, plural: str, namespace: str | None,
            name: str) -> dict[str, Any] | None:
        found = super().get(api_version, plural, namespace, name)
        if plural == "configmaps" and (between := self.between) is not None:
            self.between = None
            between()
        return found


def test_a_record_and_the_reclaim_emptying_its_configmap_never_lose_an_entry(
        ready: Cluster) -> None:
    """The deletion of an emptied record is conditional on the version read: a record
    made since keeps it. A record that read it just before it went makes it again."""
    storage = "sqlite:////var/lib/slopilot/study.db"
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, storage)
    (shard,) = read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).shards
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, NS, storage)  # a build meanwhile
    assert not forget(ready.kube, DEFAULT_OPERATOR_NAMESPACE, shard, [entry_key(NS, storage)])
    assert [e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
            ] == [storage]

    (shard,) = read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).shards
    dropped: list[bool] = []
    emptied = Interleaved(ready.kube, lambda: dropped.append(forget(
        ready.kube, DEFAULT_OPERATOR_NAMESPACE, shard, [entry_key(NS, storage)])))
    record(emptied, DEFAULT_OPERATOR_NAMESPACE, NS, storage)
    assert dropped == [True]  # the reclaim emptied it between the read and the write
    assert [e.storage for e in read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries
            ] == [storage]
