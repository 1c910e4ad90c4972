"""``SpecReconciles``: the spec reconciles of every namespace on a fair share of kopf's
handler threads.

kopf runs one handler of an object at a time, each sync one on its one pool of threads,
first come first served. A tenant editing a hundred CRs without pause kept a reconcile of
each queued there, and a quiet namespace's reconcile waited behind all of them (with 128
such CRs, 10 s where it took 50 ms alone). The drift repairs, the pod syncs and the
tuning steps each had a namespace's share already; the spec reconciles did not.

So the spec handler (handlers.reconcile_llmdeployment) is async: it waits for a slot of
its namespace's in asyncio, holding no thread, and only then runs the reconcile on
kopf's threads (``executor``). At most ``RECONCILES`` run at once and
``RECONCILES_PER_NAMESPACE`` of one namespace's; a freed slot goes round the waiting
namespaces in turn (fair_slots.py), so a namespace's reconcile waits for about one round
of the others', never their backlog. Not coalesced, as the repairs are: kopf keeps each
handler's progress on the object and must see this one end.

Used from one event loop (kopf's): the slots are kept on it, without a lock.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from slopilot.operator.fair_slots import FairSlots
from slopilot.operator.settings import HANDLER_THREADS

T = TypeVar("T")

RECONCILES = HANDLER_THREADS // 4
"""Spec reconciles of every namespace at once, on kopf's ``HANDLER_THREADS``: half is the
drift repairs' (drift_repairs.py), and a quarter is left to the deletions and to what
timers run on threads, however many specs change."""
RECONCILES_PER_NAMESPACE = 2
"""Spec reconciles of one namespace at once: a reconcile is a few API calls, and an
operator restart resumes every CR of a namespace through these two."""


class SpecReconciles:
    """The spec reconciles' slots (module docstring). ``executor``: the threads they run
    on (kopf's; None: the event loop's default)."""

    def __init__(self, total: int = RECONCILES, per_namespace: int = RECONCILES_PER_NAMESPACE,
                 *, executor: Executor | None = None) -> None:
        self._slots = FairSlots(total, per_namespace)
        self._executor = executor

    def running(self) -> int:
        """Reconciles holding a slot now (those whose thread still runs included)."""
        return self._slots.running()

    def waiting(self) -> int:
        """Reconciles waiting for a slot."""
        return self._slots.waiting()

    async def run(self, namespace: str, work: Callable[[], T]) -> T:
        """``work()`` on a thread once a slot of ``namespace``'s is free, in the caller's
        context variables (kopf posts events through them); what it returns or raises.
        Cancelled (kopf stopping the handler), the thread runs on to its end, and the
        slot is given back only then: no more run at once than the slots allow."""
        await self._slots.take(namespace, until=None)
        loop = asyncio.get_running_loop()
        try:
            done = loop.run_in_executor(self._executor, functools.partial(
                contextvars.copy_context().run, work))
        except BaseException:
            self._slots.release(namespace)
            raise
        done.add_done_callback(lambda _: self._slots.release(namespace))
        return await asyncio.shield(done)
