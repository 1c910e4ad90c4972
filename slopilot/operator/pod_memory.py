"""What the syncs of one LLMDeployment's pods remember from one sync to the next.

Two judgements need the syncs before:

- A pod that took a document (``PUT``, answered 2xx) at one sync and answers another at
  the next sync's first read has lost it without restarting (the same uid, engine
  restarts, spec generation and document: a hold's key, pod_holds.py). An engine answers
  what it took until it restarts; an image that takes each PUT, answers the read right
  after it with what it took and reverts by the next sync was sent the same PUT, a live
  reconfiguration of the engine, at every sync. It is held, as one that contradicts its
  PUT at once is (``took``).
- A pod named in ``PodsConfigured`` (``status.pods.notConfigured``) is named at the
  first sync that finds it wrong, and named no more only once ``CONFIRM_SYNCS`` syncs
  in a row find it right; twice as many each time it comes back within ``CALM_SYNCS``
  of being named no more, up to ``MAX_CONFIRM_SYNCS`` (``confirm``). A pod found wrong
  and right by turns had the condition, and so the CR's status, written at every sync:
  now it is written when the pod is first named, and for an image that is right a few
  syncs in a row between wrong ones, a few times more, then not again. A named pod
  that is not ready is not checked, and keeps both its name in the status and its count
  while it is there (the same uid, not deleted): dropped then, an image that failed its
  readiness probe at every other sync had the status written at every sync.

Kept in the operator's memory (kopf's memo of the CR, which the timer's syncs and the
daemon's share; else the handle's own), not in the status: a count of syncs in a row
must change at every sync that finds a pod wrong after right, and written to the status
it would be the very write per sync it is there to stop. What the status keeps is the
pods named. An operator restart forgets the rest, on the safe side: a pod named stays
named (ready or not) until ``CONFIRM_SYNCS`` syncs find it right again, and a pod that
reverts is sent the document once more, then held (the hold is in the status).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slopilot.operator.pod_holds import Hold

MEMO_KEY = "pod_memory"
CONFIRM_SYNCS = 2
"""Syncs in a row that must find a named pod right before it is named no more: one
right answer between wrong ones cleared the condition, and the next named the pod
again, a status write at every sync (once a minute). Two keep an honest pod, once
brought over, named one sync (``CONFIG_SYNC_S``) longer."""
MAX_CONFIRM_SYNCS = 32
"""The most syncs in a row (half an hour at ``CONFIG_SYNC_S``) a pod must be found right
on. The count doubles each time a pod comes back soon after it was named no more: with a
fixed count an image right twice and wrong once by turns still had the status written
twice every three syncs."""
CALM_SYNCS = 60
"""Syncs in a row (an hour) that found a pod right after which it starts over at
``CONFIRM_SYNCS`` when found wrong again: a pod that misses a read now and then (a slow
answer, an engine restart) is not named longer each time."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Streak:
    right: int = 0
    """Syncs in a row that found the pod right (at most ``CALM_SYNCS``)."""
    doublings: int = 0
    """How often ``CONFIRM_SYNCS`` doubled for it."""
    named: bool = False
    """Whether it was ever named while remembered."""


class PodMemory:
    """``took``: the documents the last sync that read a pod's path sent it there;
    ``confirm``: which pods found right stay named."""

    def __init__(self) -> None:
        # The timer's sync and the daemon's may overlap while tuning is turned on or off.
        self._lock = threading.Lock()
        self._took: dict[tuple[str, str], Hold] = {}
        self._streaks: dict[str, _Streak] = {}
        self._confirmed = False
        """Whether a sync has confirmed here: before, this memory is new (an operator
        restart), and the status is all there is of the pods named."""

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

    def confirm(self, found: Sequence[tuple[str, str, bool]], named: frozenset[str],
                resting: Sequence[tuple[str, str]] = ()) -> dict[str, int]:
        """After a sync that found each pod ``(uid, name, right)``, and did not check the
        pods ``resting`` (``(uid, name)``: not ready, not deleted), where ``named`` are
        the pods the status names: each pod found right, or resting, that stays named,
        with the syncs in a row it must be found right on. A resting pod keeps what is
        remembered of it, and stays named where this memory knows its uid (an image that
        fails its readiness probe at every other sync had it leave the status and come
        back, a write at every sync), or, at a new memory's first sync, where the status
        names it (an operator restart had it leave, and come back once ready); other
        pods are forgotten."""
        stay: dict[str, int] = {}
        with self._lock:
            streaks: dict[str, _Streak] = {}
            for uid, name in resting:
                was = self._streaks.get(uid)
                if was is None and not self._confirmed and name in named:
                    # A restart forgot it: named by the status, it is taken as the pod
                    # it names, and starts over, on the safe side.
                    was = _Streak()
                if was is None:
                    continue  # another pod of the name
                if name in named:
                    stay[name] = _need(was.doublings)
                    was = dataclasses.replace(was, named=True)
                streaks[uid] = was
            for uid, name, right in found:
                was = self._streaks.get(uid, _Streak())
                if not right:
                    doublings = was.doublings
                    if name not in named and not (was.named and was.right < CALM_SYNCS):
                        doublings = 0  # named for the first time, or long ago
                    elif name not in named and _need(doublings) < MAX_CONFIRM_SYNCS:
                        doublings += 1  # named again soon after it was named no more
                    streaks[uid] = _Streak(0, doublings, True)
                    continue
                now = dataclasses.replace(was, right=min(was.right + 1, CALM_SYNCS))
                need = _need(now.doublings)
                if name in named and now.right < need:
                    stay[name] = need
                    now = dataclasses.replace(now, named=True)
                streaks[uid] = now
            self._streaks, self._confirmed = streaks, True
        return stay


def _need(doublings: int) -> int:
    return min(CONFIRM_SYNCS << doublings, MAX_CONFIRM_SYNCS)


def named_of(body: Mapping[str, Any]) -> frozenset[str]:
    """The pods ``body``'s status names (``status.pods.notConfigured``); none where it
    records something else (the status is whoever may write it)."""
    status = body.get("status")
    pods = status.get("pods") if isinstance(status, Mapping) else None
    raw = pods.get("notConfigured") if isinstance(pods, Mapping) else None
    if not isinstance(raw, list):
        return frozenset()
    return frozenset(n for n in raw if isinstance(n, str))


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
