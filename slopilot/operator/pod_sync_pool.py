"""``PodSyncPool``: the operator's threads for the pod syncs of deployments whose tuning
is off, each namespace's share of them, handed out in turn.

A pod sync asks the tenant's own image (pod_admin.py), which may answer each request
just inside its deadline: up to ``SYNC_DEADLINE_S`` a sync, after each reconcile and at
every ``CONFIG_SYNC_S``. The syncs ran on kopf's handler threads, at most 2 of one
namespace and 12 of all at once, and a sync past either was refused, for the timer to
try at its next interval: six namespaces whose pods answered slowly held all twelve,
took each back as soon as it freed, and a seventh namespace's syncs were refused at
every interval, its edits and drift repairs never reaching its pods.

So pod syncs run on a pool of their own, ``SYNC_THREADS`` threads, at most
``SYNCS_PER_NAMESPACE`` of one namespace's at once. A sync past either waits for a slot
in asyncio, holding no thread, and a freed slot goes round the waiting namespaces in
turn (fair_slots.py, as the tuning steps' do): a namespace's sync waits for about one
round of the others' syncs, never for good. kopf's handler threads hold no pod sync.

One sync per CR at once (the CR's memory of its pods, pod_memory.py, is one sync's at a
time): ``ask`` joins the CR's sync that waits or runs. One asked ``again`` (after an
edit) while the CR's runs is run once more when it ends, reading the CR then: the edit
reaches the pods although the sync under way read the spec before it. A sync that waits
reads the CR only once it runs, so an edit needs nothing more from it.

A sync withdrawn while it waits (``withdraw``: its CR deleted, its timer stopped;
``shutdown``: the operator exiting) runs nothing and gives its place on; one under way
runs to its end on its thread, bounded by its deadline, holding its slot till then.

The syncs are kept as the drift repairs are (coalesced_jobs.py), on threads of their
own, a sync asked again run once more on the slot it holds.

Used from one event loop (kopf's): the slots and the syncs are kept on it, without a
lock; a handler on one of kopf's threads asks through ``ask_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from slopilot.operator.coalesced_jobs import CoalescedJobs, Job
from slopilot.operator.daemon_pause import STOP_CHECK_S
from slopilot.operator.fair_slots import FairSlots

log = logging.getLogger(__name__)

SYNC_THREADS = 12
"""Pod syncs of every namespace at once. A sync mostly waits on the pods, so the count
is not tied to CPUs; with kopf's ``HANDLER_THREADS`` and the tuning pool's
``STEP_THREADS`` it stays within the API connections kubeapi.py keeps
(``CONNECTION_POOL``): each sync reads the CR and its pods and writes its status."""
SYNCS_PER_NAMESPACE = 2
"""Pod syncs of one namespace at once. A healthy engine answers a sync in milliseconds,
so two keep up with hundreds of CRs a namespace per ``CONFIG_SYNC_S``; a namespace whose
images drip their answers holds 2 of ``SYNC_THREADS``, and 6 such namespaces at once
are needed to fill the pool (whose freed slots still go round every namespace in
turn)."""


class Waited(enum.Enum):
    """How ``PodSyncPool.wait`` ended."""

    ENDED = "ended"  # the sync is over: run, or withdrawn
    STOPPED = "stopped"  # the waiter's ``until`` held first
    LATE = "late"  # the sync still waits for a slot at the waiter's ``late_at``


class Ticket(Job):
    """One CR's sync, waiting for a slot or under way (``started``)."""

    def __init__(self, namespace: str, name: str, uid: str, sync: Callable[[], object],
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(namespace, name, sync, loop)
        self.uid = uid
        self.asked_at = loop.time()
        """The event loop's clock when the sync was asked."""

    @property
    def sync(self) -> Callable[[], object]:
        return self.run

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.name, self.uid)


class PodSyncPool:
    """The pod syncs' threads and their slots (module docstring). ``loop``: the event
    loop ``ask_threadsafe`` asks on (kopf's); None, the running loop is asked directly
    only."""

    def __init__(self, threads: int = SYNC_THREADS,
                 per_namespace: int = SYNCS_PER_NAMESPACE, *,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        if per_namespace < 1 or threads < per_namespace:
            raise ValueError(f"threads={threads!r}, per_namespace={per_namespace!r}: "
                             "expected 1 <= per_namespace <= threads")
        self.threads, self.per_namespace = threads, per_namespace
        self.loop = loop
        self._executor = ThreadPoolExecutor(max_workers=threads,
                                            thread_name_prefix="pod-sync")
        self._slots = FairSlots(threads, per_namespace)
        # A sync asked again runs again on the slot it holds: the edit reaches the pods
        # with no second wait, and the sync's deadline still bounds the slot's hold.
        self._syncs: CoalescedJobs[Ticket] = CoalescedJobs(
            self._slots, self._executor, again_at_back=False, what="pod sync",
            not_done="the pods' configs were not checked", log=log)

    def running(self) -> int:
        """Syncs holding a slot now."""
        return self._slots.running()

    def waiting(self) -> int:
        """Syncs waiting for a slot."""
        return self._slots.waiting()

    def syncs(self) -> int:
        """CRs whose sync waits or runs."""
        return len(self._syncs)

    def ask(self, namespace: str, name: str, uid: str, sync: Callable[[], object], *,
            again: bool = False) -> Ticket:
        """The sync of CR ``namespace/name`` (``uid``): the one that waits or runs, or
        ``sync()`` on a thread, in the caller's context variables (kopf posts events
        through them), once a slot is free. ``again``: a sync under way runs once more
        at its end (module docstring). After ``shutdown``, a ticket already over."""
        loop = asyncio.get_running_loop()
        return self._syncs.ask(
            (namespace, name, uid), sync,
            lambda bound: Ticket(namespace, name, uid, bound, loop), again=again)

    def ask_threadsafe(self, namespace: str, name: str, uid: str,
                       sync: Callable[[], object], *, again: bool = False) -> None:
        """``ask`` from a thread other than the loop's (a sync handler's), not waiting
        for the sync: it runs in the calling thread's context variables."""
        if self.loop is None:
            raise RuntimeError("PodSyncPool: no event loop to ask on (loop=None)")
        with contextlib.suppress(RuntimeError):  # the loop closed: the operator exited
            # call_soon_threadsafe copies this thread's context for the call.
            self.loop.call_soon_threadsafe(
                functools.partial(self.ask, namespace, name, uid, sync, again=again))

    async def wait(self, ticket: Ticket, *, until: Callable[[], bool] | None = None,
                   late_at: float | None = None) -> Waited:
        """Until ``ticket``'s sync is over, ``until()`` holds, or (``late_at``, the loop's
        clock) the sync still waits for a slot then. Nothing is withdrawn here: a stop
        ends this wait only. Awaiting it never cancels the sync, which others may wait
        for too."""
        loop = asyncio.get_running_loop()
        while not ticket.done.done():
            if until is not None and until():
                return Waited.STOPPED
            timeout = None if until is None else STOP_CHECK_S
            late = late_at is not None and not ticket.started
            if late_at is not None and late:
                left = max(0.0, late_at - loop.time())
                timeout = left if timeout is None else min(timeout, left)
            # Polled as the slots' own wait is (fair_slots.py), the future shared. Late
            # only after a turn of the loop: a sync just asked takes a free slot in it.
            await asyncio.wait((ticket.done,), timeout=timeout)
            if late_at is not None and late and not ticket.started \
                    and not ticket.done.done() and loop.time() >= late_at:
                return Waited.LATE
        return Waited.ENDED

    def withdraw(self, namespace: str, name: str, uid: str) -> bool:
        """The CR's sync, where it still waits for a slot, ended with nothing run (its
        place given on); whether one was. One under way runs to its end."""
        return self._syncs.withdraw((namespace, name, uid))

    def why_waiting(self, namespace: str) -> str:
        """Whose syncs hold the slots a sync of ``namespace`` waits for, for the user."""
        held = self._slots.held(namespace)
        if held >= self.per_namespace:
            return (f"namespace {namespace} runs the most syncs one namespace runs at once "
                    f"({held}, SYNCS_PER_NAMESPACE), on pods that answer slowly: see its "
                    "deployments' PodsConfigured conditions")
        return (f"the operator's {self.threads} pod syncs at once (SYNC_THREADS) are all "
                f"under way, for other deployments; {self._slots.namespaces_waiting()} "
                "namespaces wait, and the slots go round them in turn")

    def shutdown(self) -> None:
        """Every sync that waits withdrawn, none asked after run; the threads end once
        the syncs under way do (their deadlines bound them)."""
        self._syncs.close()
        self._executor.shutdown(wait=False)
