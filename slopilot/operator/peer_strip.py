"""A served namespace's KopfPeering rid of the peers no replica registered.

kopf reads every peer entry of a served namespace's KopfPeering as a fellow operator,
and pauses the whole operator while one of them is alive with a higher or the same
priority (peer_registry.py tells why a tenant could write one there). So each peering
object the keeper sees (peering_keeper.py: each listing, each event) is judged against
the registrations in the operator's namespace: an entry whose id no fresh registration
holds is removed, and one whose priority is not the registered one is set back to it
(a JSON merge patch conditional on the object's resourceVersion: a keep-alive written
meanwhile makes it a 409, and the event of that write is judged again). Each namespace
found written so is warned of, at most once per ``WARN_EVERY_S``.

Registrations are read once and kept; an entry they do not vouch for has them read again
before it is judged (a replica that started since registered before its kopf wrote), so
the keep-alives of the known replicas cost no call, and each forged write one list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import iso8601

from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.peer_registry import (
    ROLE,
    Registered,
    Wall,
    read_registrations,
    utc_now,
)
from slopilot.operator.peering import API_VERSION

log = logging.getLogger(__name__)
WARN_EVERY_S = 600.0
"""How often one namespace's forged peers are warned of again, while written again."""
SHOWN_IDS = 3
"""Forged ids a warning names (tenant text: each cut to ``SHOWN_ID_CHARS``)."""
SHOWN_ID_CHARS = 60


def corrections(status: Any, registered: Mapping[str, int]) -> dict[str, Any]:
    """The merge patch of ``status`` (peer id -> entry) that leaves only the registered
    ids, each at its registered priority: ``{id: None}`` for an id not registered (or an
    entry kopf could not read), ``{id: {"priority": p}}`` for a wrong priority. Empty
    where nothing is to change."""
    if not isinstance(status, dict):
        return {}
    patch: dict[str, Any] = {}
    for peer, entry in status.items():
        if peer not in registered or not _readable(entry):
            patch[peer] = None
        elif entry.get("priority") != registered[peer] or isinstance(
                entry.get("priority"), bool):
            patch[peer] = {"priority": registered[peer]}
    return patch


def _readable(entry: Any) -> bool:
    """Whether kopf reads ``entry`` without failing (its Peer: ``int(lifetime)``, an ISO
    ``lastseen``): one it cannot read would end its watch of the peering object."""
    if not isinstance(entry, dict):
        return False
    try:
        int(entry.get("lifetime", 60))
        lastseen = entry.get("lastseen")
        if lastseen is not None:
            iso8601.parse_date(lastseen)
    except (TypeError, ValueError, iso8601.ParseError):
        return False
    return True


@dataclass
class PeerStrip:
    """The judge of the served namespaces' peering objects ``peering``, against the
    registrations in ``namespace`` (peer_registry.py). ``own``: this replica's identity
    and priority, vouched for whatever its Lease says (its renewal late is no reason to
    hide itself)."""

    kube: Kube
    peering: str
    namespace: str
    lifetime_s: float
    own: tuple[str, int]
    served: Callable[[str], bool]
    wall: Wall = utc_now
    clock: Callable[[], float] = time.monotonic
    stop: threading.Event = field(default_factory=threading.Event)
    _known: dict[str, Registered] | None = None
    _warned: dict[str, float] = field(default_factory=dict)
    _unread_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def registered(self, *, fresh_read: bool) -> dict[str, int]:
        """id -> priority of each fresh registration (read again where ``fresh_read``)."""
        if fresh_read or self._known is None:
            self._known, _ = read_registrations(self.kube, self.namespace, self.peering)
        now = self.wall()
        found = {r.identity: r.priority for r in self._known.values()
                 if r.fresh(now, self.lifetime_s)}
        found[self.own[0]] = self.own[1]
        return found

    def judge(self, peering: Mapping[str, Any]) -> None:
        """Strip ``peering`` (a KopfPeering as listed or watched) of what no replica
        registered; a refused read of the registrations is warned of (rate-limited), a
        refused patch raised (ApiError)."""
        meta = peering.get("metadata") or {}
        ns = meta.get("namespace")
        if (meta.get("name") != self.peering or not isinstance(ns, str)
                or not self.served(ns) or self.stop.is_set()):
            return
        status = peering.get("status")
        with self._lock:
            try:
                patch = corrections(status, self.registered(fresh_read=False))
                if patch:
                    patch = corrections(status, self.registered(fresh_read=True))
            except ApiError as exc:
                self._unread(exc)
                return
        if not patch:
            return
        try:
            self.kube.patch(API_VERSION, "kopfpeerings", ns, self.peering, {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": patch})
        except ApiError as exc:
            if exc.status in (404, 409):  # gone, or written since: its event comes
                log.debug("KopfPeering %s/%s not stripped (%s)", ns, self.peering, exc)
                return
            raise
        self._warn(ns, patch)

    def _unread(self, exc: ApiError) -> None:
        # Each keep-alive of each namespace would say it again: once per WARN_EVERY_S.
        now = self.clock()
        if self._unread_at is not None and now - self._unread_at < WARN_EVERY_S:
            return
        self._unread_at = now
        log.warning("slopilot operator: the peer registrations in namespace %s may not be "
                    "listed (%s): forged peers in the served namespaces' KopfPeerings are "
                    "not removed meanwhile; bind the Role %s (manifests/rbac.yaml)",
                    self.namespace, exc, ROLE)

    def _warn(self, ns: str, patch: Mapping[str, Any]) -> None:
        now = self.clock()
        last = self._warned.get(ns)
        if last is not None and now - last < WARN_EVERY_S:
            log.debug("KopfPeering %s/%s stripped again: %s", ns, self.peering, list(patch))
            return
        self._warned[ns] = now
        removed = [p for p, v in patch.items() if v is None]
        fixed = [p for p, v in patch.items() if v is not None]
        said = []
        if removed:
            said.append(f"removed {len(removed)} peer(s) no replica of this operator "
                        f"registered ({_ids(removed)})")
        if fixed:
            said.append(f"set {len(fixed)} peer(s) back to their registered priority "
                        f"({_ids(fixed)})")
        log.warning("slopilot operator: the KopfPeering %s/%s was written by someone other "
                    "than the operator: %s. Tenants must not write kopfpeerings: a peer "
                    "entry there pauses the operator in every namespace it serves; grant "
                    "tenants no create, update or patch on kopfpeerings.kopf.dev "
                    "(said again at most each %.0f min)", ns, self.peering,
                    "; ".join(said), WARN_EVERY_S / 60)


def _ids(ids: list[str]) -> str:
    shown = ", ".join(repr(i[:SHOWN_ID_CHARS]) for i in ids[:SHOWN_IDS])
    return shown + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")
