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
  counts as no (the trial's record rendered, as with no stamp) and goes on in a thread
  of its own (at most ``WORKERS`` at once, one per question; with every one held, a
  question is a no at once), its answer kept when it comes. A PostgreSQL storage has a
  connect timeout (``heartbeat.rdb_storage``) but no statement timeout: a server that
  accepts and never answers held the read, and with it the reconcile.
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
"""How long a no (or no answer) is kept: the loop's step (``CONFIG_SYNC_S``)."""
READ_DEADLINE_S = 2.0
"""How long a reconcile waits for the study's answer; a study read is milliseconds."""
WORKERS = 4
"""Reads under way at once, every CR's together; past it a question is a no at once."""
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
                 max_kept: int = MAX_KEPT) -> None:
        if not_failed_s < 0 or deadline_s <= 0 or workers < 1 or max_kept < 1:
            raise ValueError(
                f"not_failed_s={not_failed_s!r}, deadline_s={deadline_s!r}, "
                f"workers={workers!r}, max_kept={max_kept!r}: expected not_failed_s >= 0, "
                "deadline_s > 0, workers >= 1 and max_kept >= 1")
        self._clock, self._not_failed_s, self._deadline_s = clock, not_failed_s, deadline_s
        self._workers, self._max_kept = workers, max_kept
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()
        self._asking: dict[Hashable, _Asking] = {}
        self._lock = threading.Lock()

    def failed(self, key: Hashable, ask: Callable[[], bool]) -> bool:
        """Whether the trial ``key`` was told failed: kept, or ``ask``'s answer (module
        docstring). An ``ask`` that raises counts as no."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and (kept.failed or self._clock() < kept.until):
                self._kept.move_to_end(key)
                return kept.failed
            asking = self._asking.get(key)
            if asking is None:
                if len(self._asking) >= self._workers:  # each held by a silent database
                    self._keep(key, False)
                    return False
                asking = self._asking[key] = _Asking()
                # A daemon thread: a read the database never answers holds no exit.
                threading.Thread(target=self._ask, args=(key, ask, asking), daemon=True,
                                 name="failed-trials").start()
        if asking.done.wait(self._deadline_s):
            return asking.failed
        with self._lock:  # the read goes on; until it answers, no (and no second read)
            kept = self._kept.get(key)
            if kept is None or not kept.failed:
                self._keep(key, False)
                return False
            return True

    def _ask(self, key: Hashable, ask: Callable[[], bool], asking: _Asking) -> None:
        try:
            answer = bool(ask())
        except Exception as exc:  # no answer, which counts as no
            log.warning("whether trial %s was told failed is not known: %s: %s", key,
                        type(exc).__name__, exc)
            answer = False
        with self._lock:
            self._keep(key, answer)
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
