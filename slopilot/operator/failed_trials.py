"""The reconcile's question to a trial's study, whether the trial was told failed,
answered at a bounded cost.

A taken-back stamp that does not verify (vllm_take_back.py) counts only where the trial
on record was told failed in its study. The stamp is on the tenant's Deployment, which
the tenant writes, and every reconcile (kopf's handler threads, which every tenant's
CRs share) would ask the study: a database read each, and with the database slow or
down a reconcile held for as long as it was. So each question is asked:

- once for good where the answer is yes: a trial told failed is never running again
  (its study, named by the CR's uid, is no one else's);
- at most once per ``NOT_FAILED_KEPT_S`` where it is no, or the study cannot be read:
  a trial this process's own loop ends is stamped under this process's key, which
  verifies without a question; one ended by another process (an operator restarted
  under a new key) is asked of by this one's first reconcile, with nothing kept yet;
- with at most ``READ_DEADLINE_S`` of the reconcile's time: a read not answered by then
  goes on in a thread of its own (at most ``WORKERS`` at once, one per question; with
  every one held, a question is not asked at all for now), its answer kept when it
  comes. A PostgreSQL storage has a connect timeout and a statement timeout
  (``heartbeat.rdb_storage``): a server that accepts and then holds the read (a lock
  another session keeps) holds a worker for a minute at most, and the reconcile for the
  deadline.

A question not answered (``None``) is neither yes nor no, and the reconcile defers the
repair it was asked for (``vllm_take_back.RenderDeferred``): counted as no, the record
was rendered, and the first repair after a key rotation on a machine whose study reads
took over the deadline rolled the trial's arguments back onto every pod, to be taken
off again a step later (two rollouts a yes a moment later would have spared). Deferred,
the drift repair's timer (``drift.RETRY_S``) or the spec handler's retry
(``DEFERRED_RETRY_S``) asks again, and finds the answer kept. A storage that never
answers must not hold a CR's repairs for good (a deleted Service stays deleted while
they wait): a question unanswered for ``UNANSWERED_DEFER_S`` since it first went
unanswered is a no (kept as one), the record rendered as before. Later questions of a
trial whose read is past its deadline do not wait for it again: they are not known at
once. A read that fails (the storage unreachable) is an answer: no, kept as one, and
logged; no later read would tell more sooner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

NOT_FAILED_KEPT_S = 60.0
"""How long a no is kept: the loop's step (``CONFIG_SYNC_S``)."""
READ_DEADLINE_S = 2.0
"""How long a reconcile waits for the study's answer; a study read is milliseconds."""
WORKERS = 4
"""Reads under way at once, every CR's together; past it a question is not known at
once (no read started for it)."""
UNANSWERED_DEFER_S = 30.0
"""How long a question may go unanswered, its repair deferred, before it counts as no:
past a read's 2 s deadline a database is slow, and a PostgreSQL read is cut at its
60 s statement timeout at the latest. A deferred drift repair is tried again after
``drift.RETRY_S`` (a minute), so a storage that never answers defers a CR's repairs
once, by that minute."""
DEFERRED_RETRY_S = 10.0
"""How soon the spec handler is run again after its reconcile was deferred: a few
tries within ``UNANSWERED_DEFER_S``, each one logged by kopf as an error."""
MAX_KEPT = 4096
"""Answers kept, the least recently asked dropped first."""


@dataclass
class _Kept:
    failed: bool
    until: float  # the clock's time after which a no is asked again


@dataclass
class _Asking:
    done: threading.Event = field(default_factory=threading.Event)
    failed: bool = False


class FailedTrials:
    """Answers to "was this trial told failed", per trial (any hashable key)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 not_failed_s: float = NOT_FAILED_KEPT_S,
                 deadline_s: float = READ_DEADLINE_S, workers: int = WORKERS,
                 max_kept: int = MAX_KEPT,
                 unanswered_s: float = UNANSWERED_DEFER_S) -> None:
        if not_failed_s < 0 or deadline_s <= 0 or workers < 1 or max_kept < 1 \
                or unanswered_s < 0:
            raise ValueError(
                f"not_failed_s={not_failed_s!r}, deadline_s={deadline_s!r}, "
                f"workers={workers!r}, max_kept={max_kept!r}, "
                f"unanswered_s={unanswered_s!r}: expected not_failed_s >= 0, "
                "deadline_s > 0, workers >= 1, max_kept >= 1 and unanswered_s >= 0")
        self._clock, self._not_failed_s, self._deadline_s = clock, not_failed_s, deadline_s
        self._workers, self._max_kept = workers, max_kept
        self._unanswered_s = unanswered_s
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()
        self._asking: dict[Hashable, _Asking] = {}
        # When each question not answered went unanswered first (past its read's
        # deadline, or with no worker free): its bound counts from then.
        self._unanswered: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()

    def failed(self, key: Hashable, ask: Callable[[], bool]) -> bool | None:
        """Whether the trial ``key`` was told failed: kept, or ``ask``'s answer; None
        where it is not known yet, its read past its deadline (module docstring). An
        ``ask`` that raises counts as no."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and (kept.failed or self._clock() < kept.until):
                self._kept.move_to_end(key)
                return kept.failed
            asking = self._asking.get(key)
            if asking is None:
                if len(self._asking) >= self._workers:  # each held by a silent database
                    return self._not_answered(key)
                asking = self._asking[key] = _Asking()
                # A daemon thread: a read the database never answers holds no exit.
                threading.Thread(target=self._ask, args=(key, ask, asking), daemon=True,
                                 name="failed-trials").start()
            elif key in self._unanswered:  # past its deadline already: not waited again
                return self._not_answered(key)
        if asking.done.wait(self._deadline_s):
            return asking.failed
        with self._lock:  # the read goes on, its answer kept when it comes
            if asking.done.is_set():
                return asking.failed
            return self._not_answered(key)

    def _not_answered(self, key: Hashable) -> bool | None:
        """None (not known) while ``key`` has gone unanswered for less than its bound;
        then a no, kept as one. Under the lock."""
        now = self._clock()
        since = self._unanswered.setdefault(key, now)
        self._unanswered.move_to_end(key)
        while len(self._unanswered) > self._max_kept:
            self._unanswered.popitem(last=False)
        if now - since < self._unanswered_s:
            return None
        del self._unanswered[key]
        log.warning("whether trial %s was told failed is not answered after %g s: "
                    "counted as no", key, self._unanswered_s)
        self._keep(key, False)
        return False

    def _ask(self, key: Hashable, ask: Callable[[], bool], asking: _Asking) -> None:
        try:
            answer = bool(ask())
        except Exception as exc:  # no answer, which counts as no
            log.warning("whether trial %s was told failed is not known: %s: %s", key,
                        type(exc).__name__, exc)
            answer = False
        with self._lock:
            self._keep(key, answer)
            self._unanswered.pop(key, None)
            del self._asking[key]
            asking.failed = answer
            asking.done.set()

    def _keep(self, key: Hashable, failed: bool) -> None:
        self._kept[key] = _Kept(failed, self._clock() + self._not_failed_s)
        self._kept.move_to_end(key)
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)


FAILED_TRIALS = FailedTrials()
"""The process's answers: the reconciles of every CR ask through it."""
