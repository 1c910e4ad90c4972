"""One collection kept in view, as client-go's reflector keeps it: listed, then watched
from the listing's version, listed again when the watch ends, until the operator's stop.

A watch the API server (or a proxy in front of it) ends at once with no event, with its
version expired (410), or whose connection is lost on its own (an API server restarting,
a load balancer's idle timeout: routine, said at INFO), is listed again after a backoff:
1 s doubling up to 30 s, back to none after a watch that told events or lived 30 s. A
proxy cutting each watch at once would have a line each try: the first cut is said, then
at most one line each ``CUT_SAY_S`` summing up the cuts since, and one when a watch
holds again (it ended on its own after events or ``RELIST_CAP_S``), summing up the burst. A
refused LIST or watch (403) is the caller's to answer (``forbidden``), the refusal lasting
until a watch is let through (``let_through``): a LIST let through with its watch refused
(RBAC granting list, not watch) is no end of it. Any other error is warned of and listed
again ``MAX_RETRY_S`` later: the thread must not die (what it keeps would go stale
unnoticed). A LIST whose wait the stop abandoned (in_flight.py) ends the loop at once,
and a listing answered after the stop is acted on no more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.in_flight import Abandoned
from slopilot.operator.kubeapi import ApiError

_log = logging.getLogger(__name__)
RELIST_FIRST_S = 1.0
"""The wait before listing again after a watch that ended at once with no event..."""
RELIST_CAP_S = 30.0
"""...doubled at each such watch up to this; a watch that told an event or lived this long
resets it."""
CUT_SAY_S = 600.0
"""How often watches cut again and again are said (at INFO): the first cut at once, then
the first cut this long after the last line, summing up the cuts since (each at DEBUG)."""


@dataclass
class _Relist:
    """The backoff before listing again after watches that ended at once, told nothing."""

    clock: Callable[[], float]
    delay_s: float = 0.0

    def after(self, began: float, events: int) -> float:
        """The wait before the next LIST, after a watch that began at ``began``."""
        if events or self.clock() - began >= RELIST_CAP_S:
            self.delay_s = 0.0
        else:
            self.delay_s = min(self.delay_s * 2, RELIST_CAP_S) or RELIST_FIRST_S
        return self.delay_s


@dataclass
class _CutSaid:
    """When watches cut on their own are said: the first, then each ``CUT_SAY_S``, and
    once more when a watch holds again, summing up the burst."""

    clock: Callable[[], float]
    said: float | None = None
    unsaid: int = 0
    began: float = 0.0
    """When the burst's first cut came."""
    cuts: int = 0
    """The burst's cuts, said or not."""

    def tell(self) -> tuple[int, float] | None:
        """Each cut: None to say nothing, else the cuts to say (this one included) and
        the seconds since the last line (1 and 0 where it is said alone)."""
        now = self.clock()
        if self.said is None:
            self.began, self.cuts = now, 0
        self.cuts += 1
        if self.said is not None and now - self.said < CUT_SAY_S:
            self.unsaid += 1
            return None
        since = 0.0 if self.said is None or not self.unsaid else now - self.said
        cuts, self.said, self.unsaid = self.unsaid + 1, now, 0
        return cuts, since

    def held(self) -> tuple[int, float] | None:
        """A watch held again (its backoff reset): the burst's cuts and the seconds it
        lasted, to say where some of them went unsaid (else None), and the next cut
        starts a burst of its own. Otherwise a burst that ended was summed up only at the
        next cut, hours late, and read as cuts of those hours."""
        unsaid, self.said, self.unsaid = self.unsaid, None, 0
        return (self.cuts, self.clock() - self.began) if unsaid else None


@dataclass
class Reflector:
    """Lists and watches one collection on the calling thread until ``stop``."""

    what: str
    """The collection, as its warnings name it ("namespaces")."""
    list_all: Callable[[], dict[str, Any]]
    """One LIST: the raw listing, its version in ``metadata.resourceVersion``; Abandoned
    where the stop came first."""
    watch_from: Callable[[str], Iterable[dict[str, Any]]]
    """One watch from a version: its raw events until it ends (or the stop closes it);
    ApiError where it is refused or its version expired (410)."""
    listed: Callable[[dict[str, Any]], None]
    """Told each whole listing."""
    seen: Callable[[dict[str, Any]], None]
    """Told each event of a watch, whatever its type."""
    forbidden: Callable[[ApiError, bool], float]
    """The answer to a refused LIST or watch (or a handler's 403), told whether it is the
    first since a watch was last let through (or the start), where a refusal starts:
    returns the wait before the next LIST."""
    stop: threading.Event
    clock: Callable[[], float] = time.monotonic
    log: logging.Logger = _log
    """Where its warnings go: the caller's, so that they read as its own."""
    let_through: Callable[[], None] = lambda: None
    """Told when a watch is let through (it told an event, ended, or its version expired)
    after refusals: the refusal is over."""

    def run(self) -> None:
        relist = _Relist(self.clock)
        cut_said = _CutSaid(self.clock)
        refused = False

        def opened() -> bool:  # the new value of ``refused``
            if refused:
                self.let_through()
            return False

        while not self.stop.is_set():
            wait_s = MAX_RETRY_S
            began, events, watching = self.clock(), 0, False
            try:
                listing = self.list_all()
                if self.stop.is_set():  # answered after the stop: nothing made of it
                    return
                self.listed(listing)
                version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
                del listing  # not held through a watch that may last minutes
                began, watching = self.clock(), True
                for event in _cut_apart(self.watch_from(version)):
                    refused = opened()
                    events += 1
                    self.seen(event)
                refused = opened()
                # The watch ran its time (or the stop closed it): listed again, at once
                # unless it ended at once.
                self._held(cut_said, began, events)
                _pause(self.stop, relist.after(began, events))
                continue
            except Abandoned:  # the stop, while the LIST was in flight
                return
            except _Cut as cut:
                wait_s = relist.after(began, events)
                match cut_said.tell():
                    case None:
                        self.log.debug("slopilot operator: the watch of %s was cut (%s); "
                                       "listed again in %.0f s", self.what, cut.__cause__,
                                       wait_s)
                    case (1, _):
                        self.log.info("slopilot operator: the watch of %s was cut (%s); "
                                      "listed again in %.0f s", self.what, cut.__cause__,
                                      wait_s)
                    case (cuts, since_s):
                        self.log.info("slopilot operator: the watch of %s was cut %d times "
                                      "in the last %.0f min (the last: %s); listed again "
                                      "in %.0f s, said again in %.0f min at the soonest",
                                      self.what, cuts, since_s / 60, cut.__cause__, wait_s,
                                      CUT_SAY_S / 60)
                _pause(self.stop, wait_s)
                continue
            except ApiError as exc:
                if exc.status == 410:  # the watch's version expired: listed again
                    if watching:
                        refused = opened()
                        self._held(cut_said, began, events)
                    _pause(self.stop, relist.after(began, events))
                    continue
                if exc.status == 403:
                    wait_s = self.forbidden(exc, not refused)
                    refused = True
                else:
                    self.log.warning("slopilot operator: list or watch of %s: %s; listed "
                                     "again in %.0f s", self.what, exc, MAX_RETRY_S)
            except Exception as exc:  # the thread must not die
                self.log.warning("slopilot operator: list or watch of %s failed (%s); "
                                 "listed again in %.0f s", self.what, exc, MAX_RETRY_S)
            self.stop.wait(wait_s)


    def _held(self, cut_said: _CutSaid, began: float, events: int) -> None:
        """A watch that ended on its own, not cut: where it told events or lived (its
        backoff reset) after cuts, the cuts since the last line are summed up. A watch
        cut after events is no end of a burst: a proxy cutting each watch a moment in
        would have two lines a cut."""
        if not events and self.clock() - began < RELIST_CAP_S:
            return
        match cut_said.held():
            case (cuts, lasted_s):
                self.log.info("slopilot operator: the watch of %s holds again after %d "
                              "cuts in %.0f min", self.what, cuts, lasted_s / 60)


class _Cut(Exception):
    """A watch's connection lost on its own (raised from the urllib3 or socket error)."""


def _cut_apart(events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``events``, a lost connection raised as ``_Cut``: told apart from the same errors
    raised by a handler's own call (those take the general path)."""
    try:
        yield from events
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise _Cut() from exc


def _pause(stop: threading.Event, wait_s: float) -> None:
    if wait_s:  # the stop's own wait: the stop ends it
        stop.wait(wait_s)
