"""One collection kept in view, as client-go's reflector keeps it: listed, then watched
from the listing's version, listed again when the watch ends, until the operator's stop.

A watch the API server (or a proxy in front of it) ends at once with no event, or with
its version expired (410), is listed again after a backoff: 1 s doubling up to 30 s, back
to none after a watch that told events or lived 30 s. A refused LIST or watch (403) is
the caller's to answer (``forbidden``); any other error is warned of and listed again
``MAX_RETRY_S`` later: the thread must not die (what it keeps would go stale unnoticed).
A listing answered after the stop is acted on no more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from slopilot.operator.api_reach import MAX_RETRY_S
from slopilot.operator.kubeapi import ApiError

_log = logging.getLogger(__name__)
RELIST_FIRST_S = 1.0
"""The wait before listing again after a watch that ended at once with no event..."""
RELIST_CAP_S = 30.0
"""...doubled at each such watch up to this; a watch that told an event or lived this long
resets it."""


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
class Reflector:
    """Lists and watches one collection on the calling thread until ``stop``."""

    what: str
    """The collection, as its warnings name it ("namespaces")."""
    list_all: Callable[[], dict[str, Any]]
    """One LIST: the raw listing, its version in ``metadata.resourceVersion``."""
    watch_from: Callable[[str], Iterable[dict[str, Any]]]
    """One watch from a version: its raw events until it ends (or the stop closes it);
    ApiError where it is refused or its version expired (410)."""
    listed: Callable[[dict[str, Any]], None]
    """Told each whole listing."""
    seen: Callable[[dict[str, Any]], None]
    """Told each event of a watch, whatever its type."""
    forbidden: Callable[[ApiError, bool], float]
    """The answer to a refused LIST or watch (or a handler's 403), told whether it is the
    first since the last listing (or the start), where one warns once: returns the wait
    before the next LIST."""
    stop: threading.Event
    clock: Callable[[], float] = time.monotonic
    log: logging.Logger = _log
    """Where its warnings go: the caller's, so that they read as its own."""

    def run(self) -> None:
        relist = _Relist(self.clock)
        refused = False
        while not self.stop.is_set():
            wait_s = MAX_RETRY_S
            began, events = self.clock(), 0
            try:
                listing = self.list_all()
                if self.stop.is_set():  # answered after the stop: nothing made of it
                    return
                self.listed(listing)
                version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
                del listing  # not held through a watch that may last minutes
                refused = False
                began = self.clock()
                for event in self.watch_from(version):
                    events += 1
                    self.seen(event)
                # The watch ran its time (or the stop closed it): listed again, at once
                # unless it ended at once.
                _pause(self.stop, relist.after(began, events))
                continue
            except ApiError as exc:
                if exc.status == 410:  # the watch's version expired: listed again
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


def _pause(stop: threading.Event, wait_s: float) -> None:
    if wait_s:  # the stop's own wait: the stop ends it
        stop.wait(wait_s)
