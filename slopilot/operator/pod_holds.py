"""Pods the sync stops sending a document to: they took it and answer another.

The sync reads each pod's knobs (``GET /admin/config``) and SLO (``/admin/slo``) and
sends the spec's (``PUT``) where they differ. An engine answers what it took from then on
(``AsyncEngine.config`` is the newest accepted config); an image that takes each PUT and
answers the next GET with something else (the image is the tenant's) was sent the same
PUT at every sync, and counted as brought over each time. So after each PUT the sync
reads the pod again, and a pod that contradicts what it just took is held (so is one
that answers it then and another at the next sync's first read: pod_memory.py): named in
``PodsConfigured``, and not sent that document again while nothing that could make it
honest changes: the pod (its uid), the engine container's restarts (a restarted engine
runs its ConfigMap's config and has really lost what it was sent), the spec's generation
and the document itself (a trial's knobs on the canary).

Holds are kept in ``status.pods.held``, written with the condition: the sync of the
timer (a new handle each time), the daemon's and a restarted operator's all see them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

MAX_HOLDS = 128
"""Holds kept at most: two documents for each of ``spec.replicas.max`` (64) pods."""


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """``path`` of pod ``pod`` (``uid``, engine restarts ``restarts``) answered another
    document than ``sent`` (its digest) at spec generation ``generation``."""

    pod: str
    uid: str
    restarts: int
    generation: int | None
    path: str
    sent: str

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.generation is None:  # the API server prunes a null it has no schema for
            del out["generation"]
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Hold | None:
        """The hold ``raw`` records; None for anything else (an older operator's shape)."""
        if not isinstance(raw, Mapping):
            return None
        texts = [raw.get(k) for k in ("pod", "uid", "path", "sent")]
        restarts, generation = raw.get("restarts"), raw.get("generation")
        if not all(isinstance(t, str) for t in texts) or type(restarts) is not int or \
                not (generation is None or type(generation) is int):
            return None
        pod, uid, path, sent = (str(t) for t in texts)
        return cls(pod, uid, restarts, generation, path, sent)


def digest(document: Any) -> str:
    """A short fingerprint of a document sent to a pod (what a hold names)."""
    text = json.dumps(document, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def engine_restarts(pod: Mapping[str, Any]) -> int:
    """How often the kubelet restarted the pod's engine container (0: never, or unknown)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if isinstance(status, Mapping) and status.get("name") == "engine":
            count = status.get("restartCount")
            return count if type(count) is int else 0
    return 0


def hold_for(pod: Mapping[str, Any], generation: int | None, path: str,
             document: Any) -> Hold:
    """The hold that would keep ``document`` from ``pod``'s ``path`` as things are now."""
    meta = pod.get("metadata") or {}
    return Hold(str(meta.get("name")), str(meta.get("uid")), engine_restarts(pod),
                generation, path, digest(document))


def holds_of(body: Mapping[str, Any]) -> frozenset[Hold]:
    """The holds ``body``'s status records; none where it records something else (the
    status is whoever may write it: an older release, a tenant granted it)."""
    status = body.get("status")
    pods = status.get("pods") if isinstance(status, Mapping) else None
    raw = pods.get("held") if isinstance(pods, Mapping) else None
    if not isinstance(raw, list):
        return frozenset()
    return frozenset(h for h in map(Hold.from_dict, raw[:MAX_HOLDS]) if h is not None)
