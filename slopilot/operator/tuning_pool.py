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
namespace, first come, first served: fair_slots.py): a namespace with a thousand CRs
waiting delays another namespace's step by one of its steps per freed slot, not by a
thousand.

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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from slopilot.operator.fair_slots import FairSlots

T = TypeVar("T")

STEP_THREADS = 32
"""Steps of every namespace at once. A step mostly waits (the API server, Prometheus,
the simulator's workers), so the count is not tied to CPUs; with kopf's
``HANDLER_THREADS`` and the pod syncs' ``SYNC_THREADS`` it stays within the API
connections kubeapi.py keeps (``CONNECTION_POOL``), so no step opens and drops a
connection of its own."""
STEPS_PER_NAMESPACE = 4
"""Steps of one namespace at once. A healthy step takes a fraction of a second, so four
step a namespace's hundreds of CRs every few ticks; a namespace whose Prometheus or pods
answer slowly holds 4 of ``STEP_THREADS``, and 8 such namespaces at once are needed to
fill the pool (whose freed slots still go round every namespace in turn)."""


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
        self._slots = FairSlots(threads, per_namespace)

    def lane(self, namespace: str) -> Lane:
        """One daemon's way onto the pool: its calls run one at a time."""
        return Lane(self, namespace)

    def running(self) -> int:
        """Slots held now: calls on a thread, or about to be."""
        return self._slots.running()

    def waiting(self) -> int:
        """Calls waiting for a slot."""
        return self._slots.waiting()

    def shutdown(self) -> None:
        """The threads end once their calls do. The operator's pool lives as long as the
        operator; a test ends its own."""
        self._executor.shutdown(wait=False)

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
        self._slots.release(namespace)
        ended()


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
            await self.pool._slots.take(self.namespace, until)
            idle = self._idle = asyncio.get_running_loop().create_future()
            work = self.pool._start(self.namespace, lambda: context.run(fn),
                                    lambda: idle.set_result(None))
        return await asyncio.wrap_future(work)
