"""The operator's record of where it opened studies: (namespace, storage), one ConfigMap
per recording namespace in the operator's own namespace.

The reclaim at start (study_reclaim.py) deletes the studies of CRs gone while no
operator ran. It may open only databases some CR named: a ``sqlite:////dir/*`` or ``*``
entry of the allow-list names none, and listing every file of a directory would open
files no CR asked for. A CR's own record (``status.studyStorages``) goes with the CR. So
the operator records each storage before it opens a study there (``record``, from the
controller's build), keyed by the CR's namespace, in a place it owns and tenants do not
write: ``ConfigMap/slopilot-study-storages.<namespace>`` in the operator's namespace. A
build whose record fails opens no study (it is retried): every study the operator made
is on record.

One ConfigMap per namespace, because a ConfigMap holds at most 1 MiB of data. In one
ConfigMap for all, 64 namespaces each naming ``MAX_PER_NAMESPACE`` allowed storages of
``MAX_STORAGE_URL`` characters filled it, and from then on no other namespace's CR got a
study. A namespace's own holds at most ``MAX_PER_NAMESPACE`` entries of at most
``MAX_STORAGE_URL`` characters, at most 12 bytes apiece once JSON escapes them
(``WORST_SHARD_BYTES``, under a fifth of the limit), and ``record`` drops from it
whatever it does not trust: a namespace's record fails only for reasons of its own. A
fixed number of shared ConfigMaps would fill the same way, a few namespaces to each.
The name holds the namespace itself, not a digest of it: a namespace's name is a DNS
label, so the name is a valid one, and two namespaces never share one, so there is no
collision to guard against. The label ``SHARD_LABEL`` (the namespace) lets the reclaim
list them; a ConfigMap whose name is not its label's namespace's is not trusted at all,
and an entry of a namespace other than its ConfigMap's is ignored, so a ConfigMap puts
entries on the record of the one namespace it is named for only, each judged by the
policy for that namespace (below). The cost: the names cannot be listed in a Role's
``resourceNames``, so the Role grants ConfigMaps in the operator's namespace by verb
(manifests/rbac.yaml), where the operator keeps no other.

The single ConfigMap of the previous version (``LEDGER``) is still read by the reclaim,
never written: its entries leave as each is done with (the same rule as below), and the
ConfigMap goes once none is left. Moved into the namespaces' own at the upgrade, an
entry would cost a write per namespace and could push one out over the cap: a study not
on record leaks.

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
so an entry recorded meanwhile stays; a ConfigMap left with none is deleted, on the same
condition, and a record that then finds it gone makes it again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.knobs import MAX_STORAGE_URL
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.validation import DNS_1123_LABEL
from slopilot.tuner.study.storage_url import shown

log = logging.getLogger(__name__)
LEDGER = "slopilot-study-storages"
"""The previous version's one ConfigMap for every namespace (module docstring), and the
prefix of each namespace's own (``shard_name``)."""
SHARD_LABEL = "slopilot.dev/study-storages-of"
"""On each namespace's record: the namespace it is the record of."""
LABELS = {"app.kubernetes.io/name": "slopilot-operator",
          "app.kubernetes.io/part-of": "slopilot"}
MAX_PER_NAMESPACE = 8
"""Entries one namespace keeps (as ``status.studyStorages`` keeps 8 per CR)."""
MAX_CONFIGMAP_BYTES = 1024 * 1024
"""What the API server lets a ConfigMap's values hold, all together."""
WORST_SHARD_BYTES = MAX_PER_NAMESPACE * (12 * MAX_STORAGE_URL + 300)
"""The most one namespace's record holds: its entries, each a storage of characters JSON
writes as ``\\uXXXX\\uXXXX`` (one beyond the BMP), plus its namespace and time."""


@dataclass(frozen=True)
class Entry:
    """One storage the operator opened a study of ``namespace`` in; ``shard``: the
    ConfigMap it is on."""

    namespace: str
    storage: str
    recorded: str = ""
    shard: str = ""

    @property
    def key(self) -> str:
        return entry_key(self.namespace, self.storage)


@dataclass
class Shard:
    """One ConfigMap of the record as read: ``namespace`` None for ``LEDGER``."""

    name: str
    namespace: str | None
    resource_version: str | None = None
    entries: list[Entry] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    """Keys whose value the operator did not write (not its shape, or another
    namespace's on a namespace's own): never opened."""


@dataclass
class Ledger:
    shards: list[Shard] = field(default_factory=list)
    untrusted: list[str] = field(default_factory=list)
    """ConfigMaps labelled as a namespace's record whose name is not that namespace's:
    nothing of them is opened."""

    @property
    def entries(self) -> list[Entry]:
        return [e for shard in self.shards for e in shard.entries]


def shard_name(namespace: str) -> str:
    """The ConfigMap of ``namespace``'s record (a DNS subdomain: prefix, dot, label)."""
    return f"{LEDGER}.{namespace}"


def entry_key(namespace: str, storage: str) -> str:
    """``namespace.<digest of the storage>``: a ConfigMap key ([-._a-zA-Z0-9]), one per
    pair, so two records of one pair are one entry."""
    return f"{namespace}.{hashlib.sha256(storage.encode()).hexdigest()[:20]}"


def _entry(key: str, value: Any, shard: str, of: str | None) -> Entry | None:
    """The entry ``key: value`` holds, or None where it is not one the operator wrote
    (on a namespace's own record, ``of``: an entry of that namespace)."""
    try:
        data = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    namespace, storage = data.get("namespace"), data.get("storage")
    if not (isinstance(namespace, str) and DNS_1123_LABEL.fullmatch(namespace)
            and isinstance(storage, str) and 0 < len(storage) <= MAX_STORAGE_URL
            and key == entry_key(namespace, storage) and of in (None, namespace)):
        return None
    return Entry(namespace, storage, str(data.get("recorded") or ""), shard)


def _shard(found: Mapping[str, Any], of: str | None) -> Shard:
    meta = found.get("metadata") or {}
    shard = Shard(str(meta.get("name")), of, meta.get("resourceVersion"))
    for key, value in sorted((found.get("data") or {}).items()):
        entry = _entry(key, value, shard.name, of)
        if entry is None:
            shard.ignored.append(key)
        else:
            shard.entries.append(entry)
    return shard


def read_ledger(kube: Kube, operator_namespace: str) -> Ledger:
    """The record as it is: each namespace's, then the previous version's (empty where
    there is none). ApiError (ListError) where it cannot be read."""
    ledger = Ledger()
    for found in sorted(kube.list("v1", "configmaps", operator_namespace,
                                  label_selector=SHARD_LABEL),
                        key=lambda o: str((o.get("metadata") or {}).get("name"))):
        meta = found.get("metadata") or {}
        name, of = str(meta.get("name")), str((meta.get("labels") or {}).get(SHARD_LABEL))
        if name == LEDGER:
            continue  # read below, as the previous version wrote it
        if not DNS_1123_LABEL.fullmatch(of) or name != shard_name(of):
            ledger.untrusted.append(name)
            continue
        ledger.shards.append(_shard(found, of))
    if (old := kube.get("v1", "configmaps", operator_namespace, LEDGER)) is not None:
        ledger.shards.append(_shard(old, None))
    return ledger


def _now() -> str:
    # Microseconds: each record changes the object (and its resourceVersion), which is
    # how a reclaim that read it before learns of it (``forget``).
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


RECORD_TRIES = 3
"""A record that finds its ConfigMap made (409) or deleted (404) meanwhile tries again."""


def record(kube: Kube, operator_namespace: str, namespace: str, storage: str, *,
           now: str | None = None) -> None:
    """Put (``namespace``, ``storage``) on ``namespace``'s record, before a study is
    opened there. ApiError where the API refuses: the caller opens no study then."""
    name = shard_name(namespace)
    entry = Entry(namespace, storage, now or _now(), name)
    value = json.dumps({"namespace": namespace, "storage": storage,
                        "recorded": entry.recorded})
    labels = {**LABELS, SHARD_LABEL: namespace}
    for attempt in range(1, RECORD_TRIES + 1):
        found = kube.get("v1", "configmaps", operator_namespace, name)
        try:
            if found is None:
                kube.create("v1", "configmaps", operator_namespace, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "labels": labels},
                    "data": {entry.key: value}})
            else:
                # The labels again: a ConfigMap of this name made otherwise is made the
                # record it is named for (what was on it of another namespace, dropped).
                kube.patch("v1", "configmaps", operator_namespace, name, {
                    "metadata": {"labels": labels},
                    "data": _changes(_shard(found, namespace), entry, value)})
            return
        except ApiError as exc:
            # 409: made meanwhile (another replica); 404: deleted meanwhile, emptied by
            # the reclaim (``forget``). Read again, then patch or create.
            if exc.status not in (404, 409) or attempt == RECORD_TRIES:
                raise


def _changes(current: Shard, entry: Entry, value: str) -> dict[str, str | None]:
    """The merge patch of ``current``'s data that records ``entry`` (a null deletes)."""
    data: dict[str, str | None] = {entry.key: value}
    mine = sorted((e for e in current.entries if e.key != entry.key),
                  key=lambda e: (e.recorded, e.key))
    for old in mine[:max(0, len(mine) - MAX_PER_NAMESPACE + 1)]:
        log.warning("study storage %s of namespace %s dropped from the operator's record "
                    "(%d kept per namespace): a study of a CR deleted while no operator "
                    "runs stays there", shown(old.storage), entry.namespace,
                    MAX_PER_NAMESPACE)
        data[old.key] = None
    for key in current.ignored:  # never opened; kept, it would take up the namespace's room
        data[key] = None
    return data


def forget(kube: Kube, operator_namespace: str, shard: Shard, keys: Iterable[str]) -> bool:
    """Drop ``keys`` from ``shard`` if it is still as read (its resourceVersion), and
    delete it where none of its entries is left; False (nothing dropped) where it
    changed since: an entry recorded meanwhile may be one of them."""
    gone = dict.fromkeys(keys)
    if not gone:
        return True
    if shard.resource_version is None:
        return False
    try:
        if {e.key for e in shard.entries} <= gone.keys():
            kube.delete("v1", "configmaps", operator_namespace, shard.name,
                        resource_version=shard.resource_version)
        else:
            kube.patch("v1", "configmaps", operator_namespace, shard.name,
                       {"metadata": {"resourceVersion": shard.resource_version},
                        "data": gone})
    except ApiError as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True
