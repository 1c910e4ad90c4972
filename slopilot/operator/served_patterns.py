"""The ``--namespace`` patterns kopf serves, less the namespaces closed at the start, until
each of them is gone.

A served namespace found Terminating or gone at the start gets no KopfPeering (the API
server refuses any create there); served by kopf without one, it would pause every
namespace until it is gone, and it is held by its CRs' finalizers, which the paused
operator never releases. So it is left out of the patterns kopf is given (a glob gets its
exclusion, in kopf's syntax: ``team-*, !team-b``). kopf takes its patterns once, at
``kopf.run``, but reads the collection it was given at each namespace event it matches
(its namespace observer's ``revise_namespaces``): this collection is that one, and
``reopen`` puts a closed namespace back once it is gone. A namespace created by that name
afterwards is a new one: kopf serves it from its ADDED event, and peering_keeper.py makes
its KopfPeering. One created within moments of the old one's going can reach kopf's
watch before this one has seen the old go: kopf then serves it from its next event (any
change to it) or the next start. Where kopf may not list and watch namespaces it serves
the exact names it found at the start and notices no namespace coming or going: one left
out then is served again only at the next start (docs/operations.md, deleting a served
namespace).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence

from slopilot.operator.peering import is_glob
from slopilot.operator.study_reclaim import serving

log = logging.getLogger(__name__)


def _patterns(given: Sequence[str], closed: Collection[str]) -> tuple[str, ...]:
    kept = [ns for ns in given if ns not in closed]
    kept = [", ".join([ns, *(f"!{c}" for c in closed if serving([ns])(c))])
            if is_glob(ns) else ns for ns in kept]
    # Where every one is closed, all stay: kopf serves every namespace given none.
    return tuple(kept) or tuple(given)


class ServedPatterns(Collection[str]):
    """kopf's ``namespaces``: ``given`` less the ``closed`` ones (namespace -> why) still
    there. Safe to read from kopf's thread while another reopens one: each read sees one
    whole tuple of patterns."""

    def __init__(self, given: Sequence[str], closed: Mapping[str, str]) -> None:
        self._given = tuple(given)
        self._lock = threading.Lock()
        self._closed = dict(closed)
        self._now = _patterns(self._given, self._closed)
        for ns, why in closed.items():
            log.warning("slopilot operator: namespace %s %s: not served until it is gone "
                        "(then served again when created again); end its LLMDeployments "
                        "with `slopilot operator uninstall -n %s` (docs/operations.md, "
                        "deleting a served namespace)", ns, why, ns)

    def __iter__(self) -> Iterator[str]:
        return iter(self._now)

    def __len__(self) -> int:
        return len(self._now)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._now

    @property
    def closed(self) -> frozenset[str]:
        """The namespaces left out now."""
        return frozenset(self._closed)

    def served(self, namespace: str) -> bool:
        """Whether kopf serves ``namespace`` now (its own rule of matching)."""
        return serving(self._now)(namespace)

    def reopen(self, namespace: str) -> None:
        """``namespace`` is gone: one created by its name is served. A no-op for one not
        left out."""
        with self._lock:
            if self._closed.pop(namespace, None) is None:
                return
            self._now = _patterns(self._given, self._closed)
        log.info("slopilot operator: namespace %s is gone: served again once created "
                 "again", namespace)
