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
  goes on in a thread of its own, its answer kept when it comes. At most ``WORKERS``
  reads are under way at once, every CR's together, and at most ``READS_PER_STORAGE``
  of one storage (its URL as the policy resolves it; never logged, it may hold a
  password): a storage that holds its reads holds that many workers, not every tenant's,
  and the others' questions are still read. A question that finds the slots it needs
  held by reads past their deadline is not asked for now (not queued behind them); one
  that finds them held by reads still within theirs waits for a slot, within its own
  deadline. A PostgreSQL storage has a connect timeout and a statement timeout
  (``heartbeat.rdb_storage``): a server that accepts and then holds the read (a lock
  another session keeps) holds a worker for a minute at most, and the reconcile for the
  deadline.

A question not answered (``None``) is neither yes nor no, and the reconcile defers the
repair it was asked for (``vllm_take_back.RenderDeferred``): counted as no, the record
was rendered, and the first repair after a key rotation on a machine whose study reads
took over the deadline rolled the trial's arguments back onto every pod, to be taken off
again a step later (two rollouts a yes a moment later would have spared). Deferred, the
drift repair's timer (``drift.RETRY_S``) or the spec handler's retry
(``DEFERRED_RETRY_S``) asks again, and finds the answer kept. A storage that never
answers must not hold a CR's repairs for good (a deleted Service stays deleted while
they wait): a question unanswered for ``UNANSWERED_DEFER_S`` since it first went
unanswered is a no (kept as one). It stays marked unanswered until its storage gives a
real answer: a yes or a no, or an error within the read's deadline (the storage refuses,
or is down). Till then no later question of it waits for a read again, nor is deferred
again: before the bound passes it is not known at once, after it a no at once (a read
started where none is under way, its answer kept when it comes). So a storage that never
answers defers a CR's repairs once per trial on record in the process's life (while its
mark is among the last ``MAX_KEPT``), not at each expiry of the kept no. A read that
fails is a no, kept as one, and logged; one that fails only past its deadline (a
statement or connect timeout) leaves the mark: the storage's next read would be held as
long.
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
"""Reads under way at once, every CR's together; with every one held by a read past
its deadline a question is not known at once (no read started for it)."""
UNANSWERED_DEFER_S = 30.0
"""How long a question may go unanswered, its repair deferred, before it counts as no:
past a read's 2 s deadline a database is slow, and a PostgreSQL read is cut at its
60 s statement timeout at the latest. A deferred drift repair is tried again after
``drift.RETRY_S`` (a minute), so a storage that never answers defers a CR's repairs
once, by that minute: the bound counts from the question's first unanswered read until
its storage answers, not again at each expiry of the kept no."""
DEFERRED_RETRY_S = 10.0
"""How soon the spec handler is run again after its reconcile was deferred: a few
tries within ``UNANSWERED_DEFER_S``, each one logged by kopf as an error."""
READS_PER_STORAGE = 1
"""Reads of one storage (its URL, as the policy resolves it) under way at once: a
storage that holds its reads holds this many workers, not every CR's, and a question
of it finds its slot held by a read past its deadline is not known at once (no read
started for it). A healthy storage's reads, milliseconds each, wait for the slot."""
MAX_KEPT = 4096
"""Answers kept, the least recently asked dropped first."""


@dataclass
class _Kept:
    failed: bool
    until: float  # the clock's time after which a no is asked again


@dataclass
class _Asking:
    storage: Hashable
    started: float  # time.monotonic(): the deadline is real time, not the clock's
    done: threading.Event = field(default_factory=threading.Event)
    failed: bool = False
    overdue: bool = False  # a question waited its deadline for it


@dataclass
class _Unanswered:
    since: float  # the clock's time the question first went unanswered
    counted: bool = False  # counted as no already (logged once)


class FailedTrials:
    """Answers to "was this trial told failed", per trial (any hashable key)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *,
                 not_failed_s: float = NOT_FAILED_KEPT_S,
                 deadline_s: float = READ_DEADLINE_S, workers: int = WORKERS,
                 per_storage: int = READS_PER_STORAGE, max_kept: int = MAX_KEPT,
                 unanswered_s: float = UNANSWERED_DEFER_S) -> None:
        if not_failed_s < 0 or deadline_s <= 0 or workers < 1 or per_storage < 1 \
                or max_kept < 1 or unanswered_s < 0:
            raise ValueError(
                f"not_failed_s={not_failed_s!r}, deadline_s={deadline_s!r}, "
                f"workers={workers!r}, per_storage={per_storage!r}, "
                f"max_kept={max_kept!r}, unanswered_s={unanswered_s!r}: expected "
                "not_failed_s >= 0, deadline_s > 0, workers >= 1, per_storage >= 1, "
                "max_kept >= 1 and unanswered_s >= 0")
        self._clock, self._not_failed_s, self._deadline_s = clock, not_failed_s, deadline_s
        self._workers, self._per_storage = workers, per_storage
        self._max_kept, self._unanswered_s = max_kept, unanswered_s
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()
        self._asking: dict[Hashable, _Asking] = {}
        # The questions that went unanswered (past a read's deadline, or no read
        # started), until a real answer comes: their bound counts from then.
        self._unanswered: OrderedDict[Hashable, _Unanswered] = OrderedDict()
        self._cond = threading.Condition()

    def failed(self, key: Hashable, ask: Callable[[], bool], *,
               storage: Hashable) -> bool | None:
        """Whether the trial ``key`` was told failed: kept, or ``ask``'s answer; None
        where it is not known yet, its read past its deadline or not started (module
        docstring). ``storage`` names what ``ask`` reads (its URL: never logged), whose
        reads share its slots. An ``ask`` that raises counts as no."""
        end = time.monotonic() + self._deadline_s
        with self._cond:
            while True:
                kept = self._kept.get(key)
                if kept is not None and (kept.failed or self._clock() < kept.until):
                    self._kept.move_to_end(key)
                    return kept.failed
                asking = self._asking.get(key)
                if key in self._unanswered:  # its storage did not answer in time: not
                    # waited for again until it answers, a read started where one may be
                    if asking is None and self._holding(storage) is None:
                        self._start(key, ask, storage)
                    return self._not_answered(key)
                if asking is not None:  # another reconcile's read, within its deadline
                    break
                holding = self._holding(storage)
                if holding is None:
                    asking = self._start(key, ask, storage)
                    break
                now = time.monotonic()
                # Not queued behind reads that do not answer: a hung storage would
                # hold every reconcile that asks of it for the deadline.
                if now >= end or all(self._overdue(held, now) for held in holding):
                    return self._not_answered(key)
                # Till a read answers (its slot free) or the first goes past its deadline.
                self._cond.wait(min(end, *(held.started + self._deadline_s
                                            for held in holding)) - now)
        if asking.done.wait(max(0.0, end - time.monotonic())):
            return asking.failed
        with self._cond:  # the read goes on, its answer kept when it comes
            if asking.done.is_set():
                return asking.failed
            asking.overdue = True
            self._cond.notify_all()  # questions waiting for its slot wait no more
            return self._not_answered(key)

    def _overdue(self, asking: _Asking, now: float) -> bool:
        """Whether ``asking`` is past its read's deadline (``now``: time.monotonic())."""
        return asking.overdue or now - asking.started >= self._deadline_s

    def _holding(self, storage: Hashable) -> list[_Asking] | None:
        """None where a read of ``storage`` may start; else the reads that hold the
        slots it needs (its storage's, or every worker). Under the lock."""
        held = [a for a in self._asking.values() if a.storage == storage]
        if len(held) >= self._per_storage:
            return held
        if len(self._asking) >= self._workers:
            return list(self._asking.values())
        return None

    def _start(self, key: Hashable, ask: Callable[[], bool],
               storage: Hashable) -> _Asking:
        """A read of ``key`` started in a thread of its own. Under the lock."""
        asking = self._asking[key] = _Asking(storage, time.monotonic())
        # A daemon thread: a read the database never answers holds no exit.
        threading.Thread(target=self._ask, args=(key, ask, asking), daemon=True,
                         name="failed-trials").start()
        return asking

    def _not_answered(self, key: Hashable) -> bool | None:
        """None (not known) while ``key`` has gone unanswered for less than its bound;
        then a no, kept as one, until a real answer comes. Under the lock."""
        now = self._clock()
        mark = self._unanswered.get(key)
        if mark is None:
            mark = self._unanswered[key] = _Unanswered(now)
        self._unanswered.move_to_end(key)
        while len(self._unanswered) > self._max_kept:
            self._unanswered.popitem(last=False)
        if now - mark.since < self._unanswered_s:
            return None
        if not mark.counted:
            mark.counted = True
            log.warning("whether trial %s was told failed is not answered after %g s: "
                        "counted as no until its storage answers", key, self._unanswered_s)
        self._keep(key, False)
        return False

    def _ask(self, key: Hashable, ask: Callable[[], bool], asking: _Asking) -> None:
        try:
            answer, error = bool(ask()), None
        except Exception as exc:  # no answer, which counts as no
            log.warning("whether trial %s was told failed is not known: %s: %s", key,
                        type(exc).__name__, exc)
            answer, error = False, exc
        with self._cond:
            # An error the storage gave in time (it refuses, it is down) is its answer;
            # one it gave only past the deadline (a statement or connect timeout) is
            # not: its next read would be held as long, so not waited for again.
            late = self._overdue(asking, time.monotonic())
            if error is None or not late:
                self._unanswered.pop(key, None)
            self._keep(key, answer)
            del self._asking[key]
            asking.failed = answer
            asking.done.set()
            self._cond.notify_all()  # its slot is free

    def _keep(self, key: Hashable, failed: bool) -> None:
        self._kept[key] = _Kept(failed, self._clock() + self._not_failed_s)
        self._kept.move_to_end(key)
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)


FAILED_TRIALS = FailedTrials()
"""The process's answers: the reconciles of every CR ask through it."""
