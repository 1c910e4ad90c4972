"""The operator's record of where it opened studies: (namespace, storage), in a ConfigMap
of its own namespace.

The reclaim at start (study_reclaim.py) deletes the studies of CRs gone while no
operator ran. It may open only databases some CR named: a ``sqlite:////dir/*`` or ``*``
entry of the allow-list names none, and listing every file of a directory would open
files no CR asked for. A CR's own record (``status.studyStorages``) goes with the CR. So
the operator records each storage before it opens a study there (``record``, from the
controller's build), keyed by the CR's namespace, in a place it owns and tenants do not
write: ``ConfigMap/slopilot-study-storages`` in the operator's namespace. A build whose
record fails opens no study (it is retried): every study the operator made is on record.

Each entry is the storage the CR named (``OperatorPolicy.named_storage``:
``spec.tuning.storage`` as written, or its namespace's default storage where it names
none; never a password: the policy refuses a URL with one, and a default with one), so
the record is no secret; the reclaim judges each entry by
the policy again, for the namespace that recorded it (an allow-list entry's
``{namespace}`` is that one), and reads only what it would open for a CR of it. A
namespace keeps at most ``MAX_PER_NAMESPACE`` entries (the oldest goes, with a
warning): a tenant cycling through files of a directory storage grows only its own
share. Entries whose storage holds no study of the namespace any more, and that no live
CR names, are dropped by the reclaim (``forget``), conditional on the version it read,
so an entry recorded meanwhile stays.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.knobs import MAX_STORAGE_URL
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.validation import DNS_1123_LABEL
from slopilot.tuner.study.storage_url import shown

log = logging.getLogger(__name__)
LEDGER = "slopilot-study-storages"
MAX_PER_NAMESPACE = 8
"""Entries one namespace keeps (as ``status.studyStorages`` keeps 8 per CR)."""


@dataclass(frozen=True)
class Entry:
    """One storage the operator opened a study of ``namespace`` in."""

    namespace: str
    storage: str
    recorded: str = ""

    @property
    def key(self) -> str:
        return entry_key(self.namespace, self.storage)


@dataclass
class Ledger:
    entries: list[Entry] = field(default_factory=list)
    resource_version: str | None = None
    ignored: list[str] = field(default_factory=list)
    """Keys whose value the operator did not write (not its shape): never opened."""


def entry_key(namespace: str, storage: str) -> str:
    """``namespace.<digest of the storage>``: a ConfigMap key ([-._a-zA-Z0-9]), one per
    pair, so two records of one pair are one entry."""
    return f"{namespace}.{hashlib.sha256(storage.encode()).hexdigest()[:20]}"


def _entry(key: str, value: Any) -> Entry | None:
    """The entry ``key: value`` holds, or None where it is not one the operator wrote."""
    try:
        data = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    namespace, storage = data.get("namespace"), data.get("storage")
    if not (isinstance(namespace, str) and DNS_1123_LABEL.fullmatch(namespace)
            and isinstance(storage, str) and 0 < len(storage) <= MAX_STORAGE_URL
            and key == entry_key(namespace, storage)):
        return None
    return Entry(namespace, storage, str(data.get("recorded") or ""))


def read_ledger(kube: Kube, operator_namespace: str) -> Ledger:
    """The record as it is (empty where there is none). ApiError where it cannot be read."""
    found = kube.get("v1", "configmaps", operator_namespace, LEDGER)
    if found is None:
        return Ledger()
    ledger = Ledger(resource_version=(found.get("metadata") or {}).get("resourceVersion"))
    for key, value in sorted((found.get("data") or {}).items()):
        entry = _entry(key, value)
        if entry is None:
            ledger.ignored.append(key)
        else:
            ledger.entries.append(entry)
    return ledger


def _now() -> str:
    # Microseconds: each record changes the object (and its resourceVersion), which is
    # how a reclaim that read it before learns of it (``forget``).
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def record(kube: Kube, operator_namespace: str, namespace: str, storage: str, *,
           now: str | None = None) -> None:
    """Put (``namespace``, ``storage``) on record, before a study is opened there.
    ApiError where the API refuses: the caller opens no study then."""
    entry = Entry(namespace, storage, now or _now())
    value = json.dumps({"namespace": namespace, "storage": storage,
                        "recorded": entry.recorded})
    current = read_ledger(kube, operator_namespace)
    if current.resource_version is None:
        try:
            kube.create("v1", "configmaps", operator_namespace, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": LEDGER, "labels": {
                    "app.kubernetes.io/name": "slopilot-operator",
                    "app.kubernetes.io/part-of": "slopilot"}},
                "data": {entry.key: value}})
            return
        except ApiError as exc:
            if exc.status != 409:  # made meanwhile (another replica): patched below
                raise
            current = read_ledger(kube, operator_namespace)
    data: dict[str, str | None] = {entry.key: value}
    mine = sorted((e for e in current.entries if e.namespace == namespace
                   and e.key != entry.key), key=lambda e: (e.recorded, e.key))
    for old in mine[:max(0, len(mine) - MAX_PER_NAMESPACE + 1)]:
        log.warning("study storage %s of namespace %s dropped from the operator's record "
                    "(%d kept per namespace): a study of a CR deleted while no operator "
                    "runs stays there", shown(old.storage), namespace, MAX_PER_NAMESPACE)
        data[old.key] = None  # a merge patch's null deletes the key
    kube.patch("v1", "configmaps", operator_namespace, LEDGER, {"data": data})


def forget(kube: Kube, operator_namespace: str, keys: Iterable[str],
           resource_version: str) -> bool:
    """Drop ``keys`` if the record is still at ``resource_version``; False (nothing
    dropped) where it changed since: an entry recorded meanwhile may be one of them."""
    gone = dict.fromkeys(keys)
    if not gone:
        return True
    try:
        kube.patch("v1", "configmaps", operator_namespace, LEDGER,
                   {"metadata": {"resourceVersion": resource_version}, "data": gone})
    except ApiError as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True
