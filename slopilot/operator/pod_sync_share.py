"""``PodSyncShare``: how many of kopf's handler threads one namespace's pod syncs hold.

kopf runs every sync handler, of every tenant, on one pool of threads (``HANDLER_THREADS``,
settings.py). A pod sync asks the tenant's own image, which may answer each request just
inside its deadline (pod_admin.py): up to ``SYNC_DEADLINE_S`` on one thread, after each
reconcile and at every ``CONFIG_SYNC_S``. A tenant with as many CRs as the pool has
threads, their images answering slowly on purpose, kept every thread busy, and every
other tenant's reconciles, drift repairs and deletions waited for one.

So one namespace's syncs run on at most ``PER_NAMESPACE`` of those threads at once, and
all namespaces' on at most ``TOTAL``, which leaves ``HANDLER_THREADS - TOTAL`` threads to
the handlers that talk to the API server alone. A sync past either is not run: ``take``
answers None, and the caller says why (the timer tries again at its next interval).
Nothing waits for a slot: a thread waiting for one is held as surely as one in a sync.

One sync per CR at once, as when its lock was held around it (the CR's pod memory,
pod_memory.py, is one sync's at a time). A sync asked while the CR's own runs is not run
either; one asked after an edit (``again``) is run by the running one once more when it
ends, reading the CR then: the edit reaches the pods although the sync under way read
the spec before it.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections import Counter
from collections.abc import Callable

HANDLER_THREADS = 16
"""kopf's pool for sync handlers (``settings.execution.max_workers``); unset, it was
asyncio's default, min(32, CPUs + 4): 6 on a 2-CPU operator pod. The handlers mostly wait
on the network, so the count is not tied to CPUs; 16 give ``TOTAL`` room beside the
threads kept for the API-server-only handlers."""
PER_NAMESPACE = 2
"""Pod syncs of one namespace at once. A healthy engine answers a sync in milliseconds,
so two keep up with hundreds of CRs a namespace per ``CONFIG_SYNC_S``; a namespace whose
images drip their answers holds 2 of ``HANDLER_THREADS`` threads, not all."""
TOTAL = 12
"""Pod syncs of all namespaces at once: ``HANDLER_THREADS - 4``, so 4 threads are always
left for reconciles, drift repairs and deletions even when 6 namespaces' pods are slow."""


class Busy(enum.StrEnum):
    """Whose syncs hold the slots, where ``run`` found none."""

    DEPLOYMENT = "Deployment"  # this CR's own sync
    NAMESPACE = "Namespace"
    OPERATOR = "Operator"


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """No slot: ``busy`` says whose syncs hold them, ``message`` says it to the user."""

    busy: Busy
    message: str


class PodSyncShare:
    """The slots of pod syncs on kopf's threads (module docstring). Thread-safe."""

    def __init__(self, per_namespace: int = PER_NAMESPACE, total: int = TOTAL) -> None:
        if per_namespace < 1 or total < per_namespace:
            raise ValueError(f"per_namespace={per_namespace!r}, total={total!r}: expected "
                             "1 <= per_namespace <= total")
        self.per_namespace, self.total = per_namespace, total
        self._guard = threading.Lock()
        self._namespaces: Counter[str] = Counter()
        self._running: set[tuple[str, str]] = set()
        self._again: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        """Syncs under way now."""
        with self._guard:
            return len(self._running)

    def run(self, namespace: str, name: str, sync: Callable[[], object], *,
            again: bool = False) -> Refused | None:
        """``sync()`` of CR ``namespace/name`` on a slot, then once more for each time a
        sync of it was asked ``again`` meanwhile (None); or, with nothing run, why there
        was no slot. With ``again``, a sync of the CR under way runs once more instead
        (module docstring). What ``sync`` raises is raised, the slot given back."""
        key = (namespace, name)
        if (refused := self._take(key, again)) is not None:
            return refused
        done = False
        try:
            sync()
            while not (done := self._ended(key)):
                sync()
        finally:
            if not done:  # sync raised
                self._give_back(key)
        return None

    def _take(self, key: tuple[str, str], again: bool) -> Refused | None:
        namespace = key[0]
        with self._guard:
            if key in self._running:
                if again:
                    self._again.add(key)
                return Refused(Busy.DEPLOYMENT, "this deployment's own sync is under way")
            if self._namespaces[namespace] >= self.per_namespace:
                return Refused(Busy.NAMESPACE, (
                    f"{self.per_namespace} syncs of namespace {namespace}'s deployments "
                    "are under way at once (PER_NAMESPACE), the most one namespace gets; "
                    "their pods answer slowly: see their PodsConfigured conditions"))
            if len(self._running) >= self.total:
                return Refused(Busy.OPERATOR, (
                    f"the operator's {self.total} pod syncs at once (TOTAL) are all under "
                    "way, for other deployments"))
            self._running.add(key)
            self._namespaces[namespace] += 1
        return None

    def _ended(self, key: tuple[str, str]) -> bool:
        """Whether the CR's sync is over (its slot given back), or asked again."""
        with self._guard:
            # One section: a sync asked again between a look and the giving back would
            # find the slot still held, and be lost.
            if key in self._again:
                self._again.discard(key)
                return False
            self._release(key)
            return True

    def _give_back(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._again.discard(key)
            self._release(key)

    def _release(self, key: tuple[str, str]) -> None:
        namespace = key[0]
        self._running.discard(key)
        self._namespaces[namespace] -= 1
        if self._namespaces[namespace] <= 0:
            del self._namespaces[namespace]  # no count kept per namespace ever seen
