"""What the syncs of one LLMDeployment's pods remember from one sync to the next.

A pod that took a document (``PUT``, answered 2xx) at one sync and answers another at
the next sync's first read has lost it without restarting (the same uid, engine
restarts, spec generation and document: a hold's key, pod_holds.py). An engine answers
what it took until it restarts; an image that takes each PUT, answers the read right
after it with what it took and reverts by the next sync was sent the same PUT, a live
reconfiguration of the engine, at every sync. It is held, as one that contradicts its
PUT at once is.

Kept in the operator's memory (kopf's memo of the CR, which the timer's syncs and the
daemon's share; else the handle's own), not in the status: what each sync sent would be
a status write at every sync that sends anything. An operator restart forgets it, on
the safe side: a pod that reverts is sent the document once more, then held (the hold is
in the status).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from slopilot.operator.pod_holds import Hold

MEMO_KEY = "pod_memory"


class PodMemory:
    """``took``: the documents the last sync that read a pod's path sent it there."""

    def __init__(self) -> None:
        # The timer's sync and the daemon's may overlap while tuning is turned on or off.
        self._lock = threading.Lock()
        self._took: dict[tuple[str, str], Hold] = {}

    def took(self, hold: Hold) -> bool:
        """Whether the pod took ``hold``'s document at the last sync that read its path,
        as things are now (the same uid, restarts, generation and document)."""
        with self._lock:
            return self._took.get((hold.uid, hold.path)) == hold

    def remember(self, uids: Iterable[str],
                 seen: Iterable[tuple[str, str, Hold | None]]) -> None:
        """After a sync of the pods ``uids``: ``(uid, path, taken)`` for each path it
        read, with the hold of the document the pod took there (None: none sent). A path
        not read keeps what an earlier sync sent it, or a pod that failed every other
        read was sent the PUT every other sync."""
        with self._lock:
            live = set(uids)
            self._took = {k: h for k, h in self._took.items() if k[0] in live}
            for uid, path, taken in seen:
                if taken is None:
                    self._took.pop((uid, path), None)
                else:
                    self._took[(uid, path)] = taken

    def forget(self, uids: Iterable[str], path: str) -> None:
        """The operator sent ``path`` of these pods another document between syncs (a
        trial's knobs, a commit): their next answer is no contradiction of the last
        sync's."""
        with self._lock:
            for uid in uids:
                self._took.pop((uid, path), None)


def memory_of(memo: Any) -> PodMemory:
    """The CR's memory in kopf's per-object ``memo`` (any object kopf copies per CR:
    attributes, as ``kopf.Memo`` also serves them), made at its first use. Two first
    uses at once (the timer's and the daemon's) keep one: the other's forgetting is as
    an operator restart's."""
    found = getattr(memo, MEMO_KEY, None)
    if not isinstance(found, PodMemory):
        found = PodMemory()
        setattr(memo, MEMO_KEY, found)
    return found
