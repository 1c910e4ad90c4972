"""A KopfPeering in every namespace kopf serves, from the moment it starts serving it.

With a peering name given, kopf (1.45) pauses each namespace it starts serving until it
sees that namespace's peering object, and its pause is one for the whole operator: one
served namespace without the object stops every namespace's handlers, silently. kopf
itself never creates the object (its peering watcher only reads it, and its keep-alive
patches it where it exists). The operator makes the objects of the namespaces it names at
its start (peering.py); kopf starts serving others while it runs: each namespace a
``--namespace`` glob matches, a namespace deleted and created again (the old object went
with it), and one left out at the start that is created again (served_patterns.py).

So beside kopf, on threads of their own (a kopf handler would be paused by the very pause
it is to lift), this lists and watches namespaces, as kopf's own namespace observer does
(the same ``list, watch``: manifests/namespaced-rbac.yaml), and the peering objects of
every namespace (``list, watch`` on ``kopfpeerings`` there too): peering_needs.py makes
the object where it is missing, again where one is deleted by hand while its namespace
stays (kopf does not pause then, but its replicas there stop seeing each other), and tries
a refused create again after a backoff. Where the peering objects may not be listed or
watched, each listing of namespaces checks each served one's object instead (a GET a
minute), until a watch of them is let through. Each peering object listed or watched is
also handed to a judge, where one is given (peer_strip.py: the peers no replica
registered removed, a tenant's forged peer would pause every namespace).

Each collection is listed and watched by a reflector (reflector.py): a watch the API
server (or a proxy in front of it) ends at once with no event, or with its version
expired (410), or cut on its own (a connection reset; said at the first cut, then at
most each ``CUT_SAY_S`` summed up), is listed again after a backoff, as client-go's
reflector does: 1 s doubling up to 30 s, back to none after a watch that told events or
lived 30 s. What differs here is the answer to a refusal (403), which
lasts until a watch is let through (a LIST let through, its watch refused, is no end of
it): namespaces are tried again each ``MAX_RETRY_S`` (nothing stands in for their watch),
warned of when the refusal starts, again each ``REWARN_S`` while it lasts (each try the
same line would bury the rest of the log), and said when it ends; peering objects turn
to the GETs above, warned of once, and said when it ends.

Nothing here stops the operator. The operator's stop closes the open watches at once
(watch_stream.py), ends each wait, and frees a thread waiting for a LIST's answer
(in_flight.py: the LIST runs on a thread of its own, left to end on its own, its answer
dropped): the LIST's timeout is not cut to fit the stop, which would fail a slow but sound
LIST of a large or busy cluster at every try. ``keep_peerings`` returns once its threads
have ended, or ``JOIN_S`` after the stop for one held in another call (a create), which
makes nothing of what it reads after the stop.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.in_flight import InFlight
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.peering import API_VERSION
from slopilot.operator.peering_needs import RETRY_FIRST_S, LeftOut, PeeringKeeper
from slopilot.operator.reflector import Reflector
from slopilot.operator.watch_stream import OpenWatches, watch_events

log = logging.getLogger(__name__)
RESYNC_S = 60
"""How long one watch lasts before its collection is listed again."""
JOIN_S = 5.0
"""How long a stop waits for the keeper's threads, all together (each ends at once: its
watch closed, its LIST's wait freed, its waits the stop's; but one held in a create or a
GET); a daemon thread past that."""
STOP_WITHIN_S = 2 * JOIN_S
"""The most the operator's stop waits for ``keep_peerings`` to return."""
REWARN_S = 3600.0
"""How often a refused list or watch of namespaces, lasting, is warned of again (each try,
``MAX_RETRY_S`` apart, said at DEBUG)."""
NAMESPACES_RULE = 'apiGroups: [""], resources: [namespaces], verbs: [list, watch]'
"""The rule of ``slopilot-operator-namespaced`` a refused list or watch of namespaces
lacks, as its warning names it."""
NAMESPACES = "/api/v1/namespaces"
PEERINGS = f"/apis/{API_VERSION}/kopfpeerings"
Judge = Callable[[dict[str, Any]], None]


def keep_peerings(kube: Kube, name: str, served: Callable[[str], bool],
                  stop: threading.Event, *, left_out: LeftOut | None = None,
                  resync_s: int = RESYNC_S, clock: Callable[[], float] = time.monotonic,
                  judge: Judge | None = None) -> None:
    """Keep a peering object in each served namespace until ``stop`` (module docstring);
    returns once its threads have ended. ``left_out``: the namespaces left out of kopf's
    patterns at the start, each put back once gone. ``judge``: handed each peering object
    listed or watched (peer_strip.py: its peers no replica registered removed)."""
    keeper = PeeringKeeper(kube, name, served, left_out=left_out, clock=clock, stop=stop)
    calls = Open()
    peerings = functools.partial(_peerings, judge=judge)
    threads = [threading.Thread(target=job, args=(keeper, stop, calls, resync_s),
                                name=f"peering-keeper-{what}", daemon=True)
               for what, job in (("namespaces", _namespaces), ("peerings", peerings),
                                 ("retries", _retries))]
    for thread in threads:
        thread.start()
    stop.wait()
    calls.close_all()
    join_within(threads, JOIN_S)


@dataclass
class Open:
    """The keeper's calls the stop ends at once: the watches open (closed) and the LISTs
    in flight (their waits freed)."""

    watches: OpenWatches = field(default_factory=OpenWatches)
    lists: InFlight = field(default_factory=InFlight)

    def close_all(self) -> None:
        self.watches.close_all()
        self.lists.abandon_all()


def join_within(threads: Iterable[threading.Thread], within_s: float,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Each of ``threads`` joined, all within ``within_s`` from now: each joined with a
    timeout of its own, a stop waited for the threads in a LIST one after another."""
    deadline = clock() + within_s
    for thread in threads:
        thread.join(max(0.0, deadline - clock()))


def _namespaces(keeper: PeeringKeeper, stop: threading.Event, calls: Open,
                resync_s: int) -> None:
    def seen(event: dict[str, Any]) -> None:
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            keeper.seen(event["object"], event["type"])

    refusal = _Refusal(keeper.clock)

    def forbidden(exc: ApiError, first: bool) -> float:
        # Nothing stands in for this watch, but a line each try would bury the rest of
        # the log: said at the refusal's start, then each REWARN_S while it lasts.
        fix = (f"bind slopilot-operator-namespaced (manifests/namespaced-rbac.yaml, rule "
               f"{NAMESPACES_RULE}) to the operator's account with a ClusterRoleBinding")
        match refusal.tell(first):
            case None:
                log.debug("slopilot operator: may not list or watch namespaces (%s)", exc)
            case 0:
                log.warning("slopilot operator: may not list or watch namespaces (%s): a "
                            "namespace created again or matched by a glob gets no "
                            "KopfPeering; %s; tried again each %.0f s, said again each "
                            "%.0f min while refused", exc, fix, MAX_RETRY_S, REWARN_S / 60)
            case tries:
                log.warning("slopilot operator: still may not list or watch namespaces "
                            "(%s), %d tries refused in %.0f min: a namespace created again "
                            "or matched by a glob gets no KopfPeering; %s", exc, tries,
                            refusal.lasted_s() / 60, fix)
        return MAX_RETRY_S

    def let_through() -> None:
        log.info("slopilot operator: may list and watch namespaces again (refused %.0f min)",
                 refusal.lasted_s() / 60)

    _reflector(keeper, stop, calls, resync_s, NAMESPACES, "namespaces",
               listed=lambda listing: keeper.listed(listing.get("items") or []),
               seen=seen, forbidden=forbidden, let_through=let_through).run()


@dataclass
class _Refusal:
    """When a lasting refusal is warned of: at its start, then each ``REWARN_S``."""

    clock: Callable[[], float]
    began: float = 0.0
    warned: float = 0.0
    tries: int = 0

    def tell(self, first: bool) -> int | None:
        """Each refused try, ``first`` where a refusal starts: 0 to warn of its start, the
        tries refused so far to warn that it lasts, None to say nothing."""
        now = self.clock()
        if first:
            self.began, self.warned, self.tries = now, now, 1
            return 0
        self.tries += 1
        if now - self.warned < REWARN_S:
            return None
        self.warned = now
        return self.tries

    def lasted_s(self) -> float:
        return self.clock() - self.began


def _peerings(keeper: PeeringKeeper, stop: threading.Event, calls: Open,
              resync_s: int, judge: Judge | None = None) -> None:
    def judged(peering: dict[str, Any]) -> None:
        if judge is None:
            return
        try:
            judge(peering)
        except Exception as exc:  # the watch must go on: the next event is judged again
            log.warning("slopilot operator: KopfPeering %s/%s not judged for forged peers "
                        "(%s)", (peering.get("metadata") or {}).get("namespace"),
                        keeper.name, exc)

    def listed(listing: dict[str, Any]) -> None:
        keeper.peerings_listed([
            str(p["metadata"].get("namespace")) for p in listing.get("items") or []
            if p.get("metadata", {}).get("name") == keeper.name])
        for peering in listing.get("items") or []:
            judged(peering)

    def seen(event: dict[str, Any]) -> None:
        meta = (event.get("object") or {}).get("metadata") or {}
        if event.get("type") == "DELETED" and meta.get("name") == keeper.name:
            keeper.peering_gone(str(meta.get("namespace")))
        elif event.get("type") in ("ADDED", "MODIFIED"):
            judged(event["object"])

    def forbidden(exc: ApiError, first: bool) -> float:
        # An install from before this grant: each served namespace's object is checked
        # by a GET at each listing of namespaces, so one warning says it all.
        keeper.recheck = True
        if first:
            log.warning("slopilot operator: may not list or watch KopfPeerings across "
                        "namespaces (%s): each served namespace's is checked each %d s "
                        "instead; bind slopilot-operator-namespaced "
                        "(manifests/namespaced-rbac.yaml)", exc, resync_s)
        return resync_s

    def let_through() -> None:
        # Set off here, not at a LIST let through: its watch may yet be refused.
        keeper.recheck = False
        log.info("slopilot operator: may list and watch KopfPeerings again: the GETs of "
                 "each served namespace's stop")

    _reflector(keeper, stop, calls, resync_s, PEERINGS, "KopfPeerings",
               listed=listed, seen=seen, forbidden=forbidden, let_through=let_through).run()


def _reflector(keeper: PeeringKeeper, stop: threading.Event, calls: Open,
               resync_s: int, path: str, what: str, *,
               listed: Callable[[dict[str, Any]], None],
               seen: Callable[[dict[str, Any]], None],
               forbidden: Callable[[ApiError, bool], float],
               let_through: Callable[[], None]) -> Reflector:
    return Reflector(
        what, list_all=lambda: calls.lists.read(lambda: keeper.kube.request("GET", path),
                                                f"{threading.current_thread().name}-list"),
        watch_from=lambda version: watch_events(keeper.kube, path, version=version,
                                                timeout_s=resync_s, watches=calls.watches),
        listed=listed, seen=seen, forbidden=forbidden, stop=stop, clock=keeper.clock,
        log=log, let_through=let_through)


def _retries(keeper: PeeringKeeper, stop: threading.Event, _calls: Open,
             _resync_s: int) -> None:
    # Each retry is due at least RETRY_FIRST_S after its refusal: a look that often is
    # soon enough, and costs a call only where one is due.
    while not stop.wait(RETRY_FIRST_S / 5):
        try:
            keeper.retry_due()
        except Exception as exc:  # the thread must not die: a retry would never come
            log.warning("slopilot operator: KopfPeering retry failed (%s)", exc)
