"""A KopfPeering in every namespace kopf serves, from the moment it starts serving it.

With a peering name given, kopf (1.45) pauses each namespace it starts serving until it
sees that namespace's peering object, and its pause is one for the whole operator: one
served namespace without the object stops every namespace's handlers, silently. The
operator makes the objects of the namespaces it names at its start (peering.py); kopf
starts serving others while it runs: each namespace a ``--namespace`` glob matches, and
a namespace deleted and created again (the old object went with it). So beside kopf
this thread lists and watches namespaces, as kopf's own namespace observer does (the
same ``list, watch`` on namespaces: manifests/namespaced-rbac.yaml), and makes the
object in each served one it has not made it in yet (by the namespace's uid: the same
name created again is a new namespace). It runs outside kopf's handlers on purpose:
a kopf handler would be paused by the very pause it is to lift.

A namespace being deleted is skipped (the API server refuses any create in it; kopf
stops serving it once it is gone), with a warning; so is one where the create is
refused (its RoleBinding not made yet): warned, and tried again at each new listing,
every ``RESYNC_S`` at most. Nothing here stops the operator.

Not watched: the peering objects themselves. One deleted by hand while its namespace
stays is made again only at the operator's next start (kopf does not pause then, but
its replicas stop seeing each other in that namespace); checking each at every listing
would cost a GET a served namespace a minute.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
import kubernetes.watch

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.kubeapi import REQUEST_TIMEOUT_S, ApiError, Kube
from slopilot.operator.peering import ensure_one, namespace_closed

log = logging.getLogger(__name__)
RESYNC_S = 60
"""How long one watch of namespaces lasts before they are listed again (and each served
namespace whose object could not be made is tried again)."""


def _terminating(namespace: dict[str, Any]) -> bool:
    return bool((namespace.get("metadata") or {}).get("deletionTimestamp")
                or (namespace.get("status") or {}).get("phase") == "Terminating")


@dataclass
class PeeringKeeper:
    """What the watch of namespaces does with each namespace it is told of."""

    kube: Kube
    name: str
    served: Callable[[str], bool]
    made: dict[str, str] = field(default_factory=dict)
    """namespace -> the uid of the namespace the object is known to be in."""
    warned: dict[str, str] = field(default_factory=dict)
    """namespace -> the uid last warned about (one warning per namespace and cause)."""

    def seen(self, namespace: dict[str, Any], event: str = "ADDED") -> None:
        meta = namespace.get("metadata") or {}
        ns, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        if not ns or not self.served(ns):
            return
        if event == "DELETED":
            self.made.pop(ns, None)
            self.warned.pop(ns, None)
            return
        if self.made.get(ns) == uid:
            return
        if _terminating(namespace):
            self._warn(ns, uid, "is being deleted (Terminating)")
            return
        try:
            ensure_one(self.kube, self.name, ns)
        except ApiError as exc:
            self._warn(ns, uid, namespace_closed(exc) or f"refused it ({exc}); tried "
                       f"again within {RESYNC_S} s")
            return
        self.made[ns] = uid
        self.warned.pop(ns, None)

    def listed(self, namespaces: Iterable[dict[str, Any]]) -> None:
        """A full listing: namespaces no longer there are forgotten, each other seen."""
        now = list(namespaces)
        present = {str((n.get("metadata") or {}).get("name", "")) for n in now}
        for gone in set(self.made) - present:
            del self.made[gone]
        for namespace in now:
            self.seen(namespace)

    def _warn(self, ns: str, uid: str, why: str) -> None:
        if self.warned.get(ns) == f"{uid} {why}":
            return
        self.warned[ns] = f"{uid} {why}"
        log.warning("slopilot operator: namespace %s %s: no KopfPeering %r made there; "
                    "while kopf serves it without one, it pauses every namespace",
                    ns, why, self.name)


def keep_peerings(kube: Kube, name: str, served: Callable[[str], bool],
                  stop: threading.Event, *, resync_s: int = RESYNC_S) -> None:
    """List and watch namespaces until ``stop``, keeping a peering object in each served
    one (module docstring). An error is logged and the listing started again."""
    keeper = PeeringKeeper(kube, name, served)
    core = kubernetes.client.CoreV1Api(kube.client)
    while not stop.is_set():
        try:
            listing = kube.request("GET", "/api/v1/namespaces")
            keeper.listed(listing.get("items") or [])
            version = (listing.get("metadata") or {}).get("resourceVersion")
            del listing
            watch = kubernetes.watch.Watch()
            # Deserialized, though only the raw object is read: without it the client's
            # events carry no ``raw_object``, which its own handling of an ERROR event
            # (an expired version) reads too.
            for event in watch.stream(core.list_namespace,
                                      timeout_seconds=resync_s, resource_version=version,
                                      _request_timeout=resync_s + REQUEST_TIMEOUT_S):
                if stop.is_set():
                    watch.stop()
                    break
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    keeper.seen(event["raw_object"], event["type"])
            continue  # the watch ran its time: listed again at once
        except (ApiError, kubernetes.client.ApiException) as exc:
            status = exc.status
            if status == 410:  # the watch's version expired: listed again at once
                continue
            if status == 403:
                log.warning("slopilot operator: may not list or watch namespaces (%s): a "
                            "namespace created again or matched by a glob gets no "
                            "KopfPeering; bind slopilot-operator-namespaced "
                            "(manifests/namespaced-rbac.yaml)", exc)
            else:
                log.warning("slopilot operator: list or watch of namespaces: %s; listed "
                            "again in %.0f s", exc, MAX_RETRY_S)
        except Exception as exc:  # the thread must not die: kopf would pause again
            log.warning("slopilot operator: list or watch of namespaces failed (%s); "
                        "listed again in %.0f s", exc, MAX_RETRY_S)
        stop.wait(MAX_RETRY_S)
