"""Which served namespaces have their KopfPeering, and when a refused one is tried again.

What peering_keeper.py's watches do with each namespace, and each peering object, they
are told of: the object is made in each served namespace not known to have it (by the
namespace's uid: the same name created again is a new namespace), made again where it
was deleted while its namespace stays, and not tried in a namespace being deleted (the
API server refuses any create there). A create refused otherwise (the namespace's
RoleBinding not made yet) is tried again after a capped exponential backoff, per
namespace: soon after a RoleBinding made a moment late, rarely for one never made. An
object deleted again soon after it was made again (a tenant allowed to delete it) is made
again after the same backoff: the first deletion is made good at once, each further one
within ``REMAKE_CALM_S`` of the last re-create waits twice as long, up to the cap.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.peering import ensure_one, namespace_closed

log = logging.getLogger(__name__)
RETRY_FIRST_S = 5.0
"""The wait before a refused create's first retry; doubled at each refusal after it..."""
RETRY_CAP_S = 300.0
"""...up to this."""
REMAKE_CALM_S = RETRY_CAP_S
"""A deletion this long after the object was last made again is made good at once."""


class LeftOut(Protocol):
    """The namespaces left out of kopf's patterns at the start (served_patterns.py)."""

    @property
    def closed(self) -> Collection[str]: ...

    def reopen(self, namespace: str) -> None: ...


def _terminating(namespace: dict[str, Any]) -> bool:
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp")
                or (namespace.get("status") or {}).get("phase") == "Terminating")


def _name_uid(namespace: dict[str, Any]) -> tuple[str, str]:
    meta = namespace.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("uid", ""))


@dataclass
class _Retry:
    uid: str
    delay_s: float
    at: float
    peering_deleted: bool = False


@dataclass
class PeeringKeeper:
    """The state behind the watches; each method may be called from any of their threads."""

    kube: Kube
    name: str
    served: Callable[[str], bool]
    left_out: LeftOut | None = None
    clock: Callable[[], float] = time.monotonic
    stop: threading.Event = field(default_factory=threading.Event)
    """The operator's stop: once set, nothing more is made (a thread left behind by it, its
    LIST answered late, acts on nothing)."""
    recheck: bool = False
    """Set from a refused LIST or watch of the peering objects until a watch of them is
    let through: each listing of namespaces then checks each served one's object (a GET
    each), so one deleted by hand is made again."""
    made: dict[str, str] = field(default_factory=dict)
    """namespace -> the uid of the namespace the object is known to be in."""
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    """namespace -> its latest object, for each served one."""
    retries: dict[str, _Retry] = field(default_factory=dict)
    remade: dict[str, _Retry] = field(default_factory=dict)
    """namespace -> when its object, deleted, was (or is to be) made again, and the backoff
    that time."""
    warned: dict[str, str] = field(default_factory=dict)
    """namespace -> the uid and cause last warned about (one warning for each)."""
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def seen(self, namespace: dict[str, Any], event: str = "ADDED") -> None:
        with self._lock:
            self._seen(namespace, event)

    def listed(self, namespaces: Iterable[dict[str, Any]]) -> None:
        """A full listing: namespaces no longer there are forgotten, each other seen."""
        with self._lock:
            now = list(namespaces)
            present = {_name_uid(n)[0] for n in now}
            closed = self.left_out.closed if self.left_out is not None else ()
            for gone in (set(self.namespaces) | set(closed)) - present:
                self._gone(gone)
            if self.recheck:
                self.made.clear()
            for namespace in now:
                self._seen(namespace, "ADDED")

    def peerings_listed(self, present: Collection[str]) -> None:
        """A full listing of the peering objects: the namespaces that have one. The
        rechecks stay on until a watch of them is let through: a LIST let through says
        nothing of the watch."""
        with self._lock:
            for ns in set(self.made) - set(present):
                self.peering_gone(ns)

    def peering_gone(self, ns: str) -> None:
        """The object in ``ns`` was deleted: made again where the namespace stays."""
        with self._lock:
            uid = self.made.pop(ns, None)
            if uid is None or ns not in self.namespaces:
                return
            now, last = self.clock(), self.remade.get(ns)
            delay = (0.0 if last is None or last.uid != uid or now - last.at >= REMAKE_CALM_S
                     else RETRY_FIRST_S if not last.delay_s
                     else min(last.delay_s * 2, RETRY_CAP_S))
            self.remade[ns] = _Retry(uid, delay, now + delay)
            if delay:  # deleted again soon after it was made again: retry_due makes it
                log.debug("the KopfPeering %s/%s is gone again: made again in %.0f s",
                          ns, self.name, delay)
                self.retries[ns] = _Retry(uid, delay, now + delay, peering_deleted=True)
                return
            # A listing may also be older than a create just made: ensure_one GETs
            # before it creates.
            log.debug("the KopfPeering %s/%s is gone: made again", ns, self.name)
            self._seen(self.namespaces[ns], "MODIFIED", peering_deleted=True)

    def retry_due(self) -> None:
        """Each refused create whose retry's time has come, tried again."""
        with self._lock:
            now = self.clock()
            for ns, retry in [(ns, r) for ns, r in self.retries.items() if r.at <= now]:
                if ns in self.namespaces:
                    self._seen(self.namespaces[ns], "MODIFIED",
                               peering_deleted=retry.peering_deleted)

    def _gone(self, ns: str) -> None:
        for known in (self.made, self.namespaces, self.retries, self.remade, self.warned):
            known.pop(ns, None)
        if self.left_out is not None:
            self.left_out.reopen(ns)

    def _seen(self, namespace: dict[str, Any], event: str, *,
              peering_deleted: bool = False) -> None:
        ns, uid = _name_uid(namespace)
        if not ns:
            return
        if event == "DELETED":
            self._gone(ns)
            return
        if not self.served(ns):
            return
        self.namespaces[ns] = namespace
        if self.made.get(ns) == uid:
            return
        if _terminating(namespace):
            self._closed(ns, uid, "is being deleted (Terminating)", peering_deleted)
            return
        retry = self.retries.get(ns)
        if retry is not None and retry.uid == uid and self.clock() < retry.at:
            return
        if self.stop.is_set():
            return
        try:
            ensure_one(self.kube, self.name, ns)
        except ApiError as exc:
            if (why := namespace_closed(exc)) is not None:
                self._closed(ns, uid, why, peering_deleted)
                return
            delay = (RETRY_FIRST_S if retry is None or retry.uid != uid
                     else min(retry.delay_s * 2, RETRY_CAP_S))
            self.retries[ns] = _Retry(uid, delay, self.clock() + delay)
            self._warn(ns, uid, f"refused it ({exc})",
                       f"; tried again after a backoff of {RETRY_FIRST_S:.0f} s doubling "
                       f"up to {RETRY_CAP_S:.0f} s")
            return
        self.made[ns] = uid
        self.retries.pop(ns, None)
        self.warned.pop(ns, None)

    def _closed(self, ns: str, uid: str, why: str, peering_deleted: bool) -> None:
        if peering_deleted:  # the namespace's deletion took it: nothing to warn of,
            log.info("slopilot operator: namespace %s %s: its KopfPeering went with it",
                     ns, why)
            self.made[ns] = uid  # nor to try again in this namespace
            return
        self._warn(ns, uid, why)

    def _warn(self, ns: str, uid: str, why: str, then: str = "") -> None:
        if self.warned.get(ns) == f"{uid} {why}":
            return
        self.warned[ns] = f"{uid} {why}"
        log.warning("slopilot operator: namespace %s %s: no KopfPeering %r made there%s; "
                    "while kopf serves it without one, it pauses every namespace",
                    ns, why, self.name, then)
