"""``TuningPool``: the operator's threads for every tuning daemon's steps, and each
namespace's share of them.

A tuning daemon is async (tuning_daemon.py), and its steps block (the API server,
Prometheus, the study's database, the simulator's workers), so each runs on a thread.
Each daemon had a thread of its own: the operator held one per tuning CR, uncapped, so
a tenant that created thousands of tuning LLMDeployments had it make thousands of
threads, and one whose pods or Prometheus answered slowly held a thread per CR.

So every daemon's steps run on one pool of ``STEP_THREADS`` threads, at most
``STEPS_PER_NAMESPACE`` of one namespace's at once. A step waits for its slot in asyncio,
holding no thread. A freed slot goes round the namespaces that wait, in turn (within a
namespace, first come, first served): a namespace with a thousand CRs waiting delays
another namespace's step by one of its steps per freed slot, not by a thousand.

One daemon's calls run one at a time (``Lane``), as its own thread ran them: a step
whose await kopf cancelled (a daemon not stopped in time) goes on on its thread, with
its slot, and the daemon's ending after it waits for it to end. A stop (``until``) ends
a wait for a slot with nothing run (``NotRun``).

Used from one event loop (kopf's): the slots are counted on it, without a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from slopilot.operator.daemon_pause import STOP_CHECK_S

T = TypeVar("T")

STEP_THREADS = 32
"""Steps of every namespace at once. A step mostly waits (the API server, Prometheus,
the simulator's workers), so the count is not tied to CPUs; with kopf's
``HANDLER_THREADS`` it stays within the API connections kubeapi.py keeps
(``CONNECTION_POOL``), so no step opens and drops a connection of its own."""
STEPS_PER_NAMESPACE = 4
"""Steps of one namespace at once. A healthy step takes a fraction of a second, so four
step a namespace's hundreds of CRs every few ticks; a namespace whose Prometheus or pods
answer slowly holds 4 of ``STEP_THREADS``, and 8 such namespaces at once are needed to
fill the pool (whose freed slots still go round every namespace in turn)."""


class NotRun(Exception):
    """The caller's ``until`` held before a slot was free: nothing was run."""


class TuningPool:
    """The tuning daemons' threads and their slots (module docstring)."""

    def __init__(self, threads: int = STEP_THREADS,
                 per_namespace: int = STEPS_PER_NAMESPACE) -> None:
        if per_namespace < 1 or threads < per_namespace:
            raise ValueError(f"threads={threads!r}, per_namespace={per_namespace!r}: "
                             "expected 1 <= per_namespace <= threads")
        self.threads, self.per_namespace = threads, per_namespace
        self._executor = ThreadPoolExecutor(max_workers=threads,
                                            thread_name_prefix="tuning-step")
        self._busy = 0
        self._running: Counter[str] = Counter()
        # Insertion order is the turn: a namespace served goes to the back.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def lane(self, namespace: str) -> Lane:
        """One daemon's way onto the pool: its calls run one at a time."""
        return Lane(self, namespace)

    def running(self) -> int:
        """Slots held now: calls on a thread, or about to be."""
        return self._busy

    def waiting(self) -> int:
        """Calls waiting for a slot."""
        return sum(len(queue) for queue in self._waiting.values())

    def shutdown(self) -> None:
        """The threads end once their calls do. The operator's pool lives as long as the
        operator; a test ends its own."""
        self._executor.shutdown(wait=False)

    async def _take(self, namespace: str, until: Callable[[], bool] | None) -> None:
        """A slot of ``namespace``'s held for the caller, or ``NotRun`` once ``until``."""
        if until is not None and until():
            raise NotRun
        if namespace not in self._waiting and self._free(namespace):
            self._hold(namespace)
            return
        grant: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(namespace, deque()).append(grant)
        try:
            while not grant.done():
                # Polled as the daemon's pause polls its stop (daemon_pause.py): kopf's
                # ``stopped.wait()`` runs a task of its own per call.
                await asyncio.wait((grant,), timeout=None if until is None else STOP_CHECK_S)
                if not grant.done() and until is not None and until():
                    raise NotRun
            if until is not None and until():  # stopped as the slot came: not taken
                raise NotRun
        except BaseException:
            if grant.done() and not grant.cancelled():
                self._release(namespace)  # given to this caller already: passed on
            else:
                grant.cancel()
                self._forget(namespace, grant)
            raise

    def _free(self, namespace: str) -> bool:
        return self._busy < self.threads and self._running[namespace] < self.per_namespace

    def _hold(self, namespace: str) -> None:
        self._busy += 1
        self._running[namespace] += 1

    def _forget(self, namespace: str, grant: asyncio.Future[None]) -> None:
        queue = self._waiting.get(namespace)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(grant)
        if not queue:
            del self._waiting[namespace]

    def _start(self, namespace: str, call: Callable[[], T],
               ended: Callable[[], None]) -> Future[T]:
        """``call`` on a thread, on the slot the caller holds: given back when it ends,
        whether or not anyone still awaits it, then ``ended()``, on the loop."""
        loop = asyncio.get_running_loop()
        work = self._executor.submit(call)

        def done(_: Future[T]) -> None:
            # Before the awaiting caller is woken (callbacks run in the order added).
            with contextlib.suppress(RuntimeError):  # the loop closed: the operator exited
                loop.call_soon_threadsafe(self._ended, namespace, ended)

        work.add_done_callback(done)
        return work

    def _ended(self, namespace: str, ended: Callable[[], None]) -> None:
        self._release(namespace)
        ended()

    def _release(self, namespace: str) -> None:
        self._busy -= 1
        self._running[namespace] -= 1
        if self._running[namespace] <= 0:
            del self._running[namespace]  # no count kept per namespace ever seen
        self._hand_out()

    def _hand_out(self) -> None:
        """Free slots to the waiting namespaces, in turn, each its first waiter."""
        while self._busy < self.threads:
            turn = next((ns for ns in self._waiting if self._free(ns)), None)
            if turn is None:
                return  # nobody waits, or only namespaces at their share
            queue = self._waiting.pop(turn)
            grant = queue.popleft()
            if queue:
                self._waiting[turn] = queue  # to the back of the turn
            grant.set_result(None)
            self._hold(turn)


class Lane:
    """One daemon's calls onto a ``TuningPool``, one at a time (module docstring)."""

    def __init__(self, pool: TuningPool, namespace: str) -> None:
        self.pool, self.namespace = pool, namespace
        self._turn = asyncio.Lock()
        self._idle: asyncio.Future[None] | None = None
        """Done once this lane's last call has left its thread."""

    async def run(self, fn: Callable[[], T], *,
                  until: Callable[[], bool] | None = None) -> T:
        """``fn()`` on one of the pool's threads, in the caller's context variables (kopf
        posts events through them), once this lane's call before has ended and a slot is
        free; ``NotRun`` where ``until`` held first. What ``fn`` raises is raised here."""
        context = contextvars.copy_context()
        async with self._turn:
            if self._idle is not None:
                # Not awaited itself: a cancelled caller would cancel it, and the next
                # call would find the last one over while it still ran.
                await asyncio.wait((self._idle,))
            await self.pool._take(self.namespace, until)
            idle = self._idle = asyncio.get_running_loop().create_future()
            work = self.pool._start(self.namespace, lambda: context.run(fn),
                                    lambda: idle.set_result(None))
        return await asyncio.wrap_future(work)
