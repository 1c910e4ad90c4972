"""Studies whose LLMDeployment is gone, reclaimed when the operator starts.

A CR's study is deleted as the CR goes (study_cleanup.py), before the operator's
finalizer lets it go. A CR whose finalizer was released without the operator
(``slopilot operator uninstall`` with no operator running and the storage out of its
reach, or a hand-made patch), or whose storage was down as it went, leaves its study
behind: a leak in a storage other tenants share, not lost data (no later CR resumes it).
A CR still Terminating counts as live: deleted while no operator ran, it is held by the
operator's finalizer until the deletion handler has deleted its study (handlers.py).

Each study's name holds its CR's namespace, name and uid (``daemon.study_name``). At
start the operator visits each storage it may open without being asked by a CR: the
administrator's allow-list entries that name one database (every namespace it serves),
and each storage on its own record of where it opened studies (study_ledger.py: the
files of a ``sqlite:////dir/*`` directory, the databases a ``*`` let CRs name; each
namespace's record, and the previous version's single one), for the namespace that
recorded it only. Each recorded storage is judged by the policy again
(``resolve_storage``), for the namespace that recorded it (``{namespace}`` in an entry is
that one: an entry recorded under a list without it, naming another namespace's file, is
refused now): one it refuses now, or a record the operator did not write, is never
opened. An entry with ``{namespace}`` names no database by itself, and is reached only
through the record, as is a default storage with ``{namespace}`` (default_storage.py:
the build records the namespace's own URL of it, as it records a written one). No
other file is opened: not a directory's other files, nor one a record names that does
not exist (it is not created). In each storage visited it deletes each
study whose namespace it serves (and, for a recorded storage, is the recording one)
and whose uid no LLMDeployment in that namespace has now. Keyed by uid, never by name: a
CR made again under a deleted one's name, in its namespace or another, has a uid of its
own, and its study is kept. The studies are listed before the CRs, so a study found
belongs to a CR made before that listing, which the listing shows while it lives. A
namespace whose CRs cannot be listed keeps every study (nothing is deleted on a guess),
and so does a name not shaped as the operator's (``slopilot tune``'s own studies).

Bounded: the storages are visited in parallel (``MAX_PARALLEL``), and the reclaim waits
``RECLAIM_BUDGET_S`` for them altogether; a storage that has not answered by then (a
database that accepts and never replies) is reported and left to its thread. It runs
beside kopf, which never waits for it. A recorded storage that holds no study of its
namespace any more, and that no live CR of it names, leaves the record.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# kopf's matcher, not a copy: which namespaces it serves is its rule (pinned kopf).
from kopf._cogs.structs.references import NamespaceName, match_namespace

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.knobs import written_storage
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.study_cleanup import recorded_storages
from slopilot.operator.study_ledger import LEDGER, Entry, Ledger, forget, read_ledger
from slopilot.operator.study_storage import StorageRefused, resolve_storage
from slopilot.operator.validation import DNS_1123_LABEL, DNS_1123_SUBDOMAIN
from slopilot.tuner.study.storage import StudyStorageError, delete_named_study, study_names
from slopilot.tuner.study.storage_url import shown
from slopilot.tuner.study.study_family import base_of

log = logging.getLogger(__name__)
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A Kubernetes uid (an RFC 4122 UUID, as the API server writes it)."""
RECLAIM_BUDGET_S = 120.0
"""How long the reclaim waits for its storages, all together (module docstring)."""
MAX_PARALLEL = 8
"""Storages visited at once: a few that never answer hold a slot each, not the rest."""
Wait = Callable[[str, threading.Event, float], bool]
"""``wait(storage shown, its visit's end, seconds left)``: whether it ended in time."""


@dataclass(frozen=True)
class StudyOwner:
    """The CR a study's name says it belongs to."""

    namespace: str
    name: str
    uid: str


@dataclass
class Reclaimed:
    """What one reclaim did."""

    deleted: list[str] = field(default_factory=list)
    """The studies deleted."""
    skipped: list[str] = field(default_factory=list)
    """``what: why`` for each storage or record entry not reclaimed from (a namespace
    whose CRs cannot be listed is logged: its studies are kept)."""
    forgotten: list[str] = field(default_factory=list)
    """``namespace storage`` for each record entry dropped (nothing of it left there)."""


@dataclass
class Visit:
    """One storage to reclaim from: ``namespaces`` None for every namespace served (an
    allow-list entry naming one database), else those that recorded it."""

    url: str
    namespaces: set[str] | None
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Visited:
    deleted: list[str] = field(default_factory=list)
    done_with: list[Entry] = field(default_factory=list)
    """The record's entries for this storage that may leave the record."""


@dataclass(frozen=True)
class Live:
    """A namespace's LLMDeployments as listed: their uids, the storages they name."""

    uids: frozenset[str]
    storages: frozenset[str]


def owner_of(study: str) -> StudyOwner | None:
    """The CR ``study`` (``namespace/name/uid``, or a successor of it that a changed
    search space moved the CR to: ``study_family.py``) was made for; None for a name the
    operator does not make."""
    parts = base_of(study).split("/")
    if len(parts) != 3:
        return None
    namespace, name, uid = parts
    if not (DNS_1123_LABEL.fullmatch(namespace) and DNS_1123_SUBDOMAIN.fullmatch(name)
            and UID.fullmatch(uid)):
        return None
    return StudyOwner(namespace, name, uid)


def listable_storages(policy: OperatorPolicy) -> list[str]:
    """The allow-list's entries that name one database, the same for every namespace
    (with their credentials). An entry with ``{namespace}`` names one per namespace:
    those are visited as recorded, each for its namespace."""
    return [r.entry for r in policy.storage_rules if r.one_database]


def serving(patterns: Sequence[str] | None) -> Callable[[str], bool]:
    """Whether the operator serves a namespace: every one (None: ``--all-namespaces``), or
    one its ``--namespace`` patterns match, by kopf's own rule (globs, comma-separated
    parts, ``!`` exclusions: ``team-*, !team-secret``), as its observer matches them."""
    if patterns is None:
        return lambda _namespace: True
    return lambda namespace: any(
        match_namespace(NamespaceName(namespace), p) for p in patterns)


def _wait(_storage: str, ended: threading.Event, seconds: float) -> bool:
    return ended.wait(seconds)


def reclaim_orphaned_studies(kube: Kube, policy: OperatorPolicy,
                             served: Callable[[str], bool], *,
                             budget_s: float = RECLAIM_BUDGET_S, wait: Wait = _wait,
                             clock: Callable[[], float] = time.monotonic) -> Reclaimed:
    """Delete every study of a gone CR from the storages to visit (module docstring). A
    storage, record entry or namespace that cannot be read is skipped, with a warning."""
    done = Reclaimed()
    ledger = _read(kube, policy, done)
    visits = _visits(policy, served, ledger, done)
    results: dict[str, Visited | Exception] = {}
    ends: dict[str, threading.Event] = {}
    slots = threading.Semaphore(MAX_PARALLEL)

    def visit(target: Visit) -> None:
        with slots:
            try:
                results[target.url] = _visit(kube, policy, target, served)
            except Exception as exc:  # the storage or the API: this storage only
                results[target.url] = exc
            finally:
                ends[target.url].set()

    for target in visits:
        ends[target.url] = threading.Event()
        threading.Thread(target=visit, args=(target,), name="study-reclaim-visit",
                         daemon=True).start()
    deadline = clock() + budget_s
    finished: list[Entry] = []
    for target in visits:
        where = shown(target.url)
        if not wait(where, ends[target.url], max(0.0, deadline - clock())):
            _skip(done, where, f"no answer in {budget_s:g} s (RECLAIM_BUDGET_S); its "
                  "orphaned studies, if any, wait for the next start")
            continue
        outcome = results[target.url]
        if isinstance(outcome, Exception):
            _skip(done, where, f"{type(outcome).__name__}: {outcome}")
            continue
        done.deleted += outcome.deleted
        finished += outcome.done_with
    _forget(kube, policy, ledger, finished, done)
    return done


def _skip(done: Reclaimed, what: str, why: str) -> None:
    log.warning("orphaned studies not reclaimed from %s: %s", what, why)
    done.skipped.append(f"{what}: {why}")


def _read(kube: Kube, policy: OperatorPolicy, done: Reclaimed) -> Ledger:
    try:
        ledger = read_ledger(kube, policy.operator_namespace)
    except Exception as exc:  # RBAC, the API: the allow-list's databases are still visited
        _skip(done, f"the record ConfigMaps {policy.operator_namespace}/{LEDGER}.*",
              f"not read ({type(exc).__name__}: {exc}); only the allow-list's databases "
              "were visited")
        return Ledger()
    for name in ledger.untrusted:
        _skip(done, f"the record ConfigMap {name}", "labelled as the record of a namespace "
              "it is not named for; not one the operator wrote, nothing of it opened")
    for shard in ledger.shards:
        for key in shard.ignored:
            _skip(done, f"{shard.name} entry {key}", "not one the operator wrote; not opened")
    return ledger


def _visits(policy: OperatorPolicy, served: Callable[[str], bool], ledger: Ledger,
            done: Reclaimed) -> list[Visit]:
    visits = {url: Visit(url, None) for url in listable_storages(policy)}
    for entry in ledger.entries:
        if not served(entry.namespace):
            continue  # another operator's, or one this one no longer serves
        try:
            url = resolve_storage(entry.storage, policy.storage_rules, entry.namespace)
        except StorageRefused as exc:
            _skip(done, f"{entry.shard} entry of namespace {entry.namespace}",
                  f"{exc}; not opened")
            continue
        target = visits.setdefault(url, Visit(url, set()))
        if target.namespaces is not None:
            target.namespaces.add(entry.namespace)
        target.entries.append(entry)
    return list(visits.values())


def _visit(kube: Kube, policy: OperatorPolicy, target: Visit,
           served: Callable[[str], bool]) -> Visited:
    """Delete the orphans of ``target``'s namespaces in its storage; which record entries
    are done with. StudyStorageError where the storage cannot be read."""
    out = Visited()
    url = target.url
    names = study_names(url)  # before the CRs are listed (module docstring)
    live: dict[str, Live | None] = {}

    def live_in(namespace: str) -> Live | None:
        if namespace not in live:
            live[namespace] = _live(kube, policy, namespace)
        return live[namespace]

    kept: set[str] = set()  # namespaces with a study left in the storage
    for study in names:
        owner = owner_of(study)
        if owner is None or not served(owner.namespace) or (
                target.namespaces is not None and owner.namespace not in target.namespaces):
            continue
        found = live_in(owner.namespace)
        if found is None or owner.uid in found.uids:
            kept.add(owner.namespace)
            continue
        try:
            gone = delete_named_study(url, study)
        except StudyStorageError as exc:
            log.warning("orphaned study %s stays in %s: %s", study, shown(url), exc)
            kept.add(owner.namespace)
            continue
        if gone:
            log.info("orphaned study %s (its LLMDeployment is gone) deleted from %s",
                     study, shown(url))
            out.deleted.append(study)
    for entry in target.entries:
        found = live_in(entry.namespace)
        if entry.namespace not in kept and found is not None \
                and entry.storage not in found.storages:
            out.done_with.append(entry)
    return out


def _live(kube: Kube, policy: OperatorPolicy, namespace: str) -> Live | None:
    """The LLMDeployments of ``namespace``; None where they cannot be read."""
    try:
        items: list[dict[str, Any]] = kube.list(API_VERSION, PLURAL, namespace)
    except Exception as exc:  # an API error, RBAC: nothing there is judged orphaned
        log.warning("orphaned studies of namespace %s not reclaimed: its LLMDeployments "
                    "could not be listed: %s: %s", namespace, type(exc).__name__, exc)
        return None
    uids, storages = set(), set()
    for item in items:
        uids.add(str((item.get("metadata") or {}).get("uid")))
        written = written_storage(
            ((item.get("spec") or {}).get("tuning") or {}).get("storage"))
        storages.update([policy.named_storage(written, namespace),
                         *recorded_storages(item.get("status"))])
    return Live(frozenset(uids), frozenset(storages))


def _forget(kube: Kube, policy: OperatorPolicy, ledger: Ledger, entries: list[Entry],
            done: Reclaimed) -> None:
    """Drop the entries done with, each ConfigMap's if it is as read
    (study_ledger.forget)."""
    for shard in ledger.shards:
        mine = [e for e in entries if e.shard == shard.name]
        if not mine:
            continue
        try:
            dropped = forget(kube, policy.operator_namespace, shard, [e.key for e in mine])
        except Exception as exc:  # kept: visited again at the next start, no harm
            log.warning("the record of study storages %s was not pruned: %s: %s",
                        shard.name, type(exc).__name__, exc)
            continue
        if not dropped:
            log.info("the record of study storages %s changed during the reclaim; its "
                     "entries stay until the next start", shard.name)
            continue
        done.forgotten += [f"{e.namespace} {shown(e.storage)}" for e in mine]
