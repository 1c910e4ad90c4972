"""``DriftRepairs``: every LLMDeployment's drift repairs, one per CR at once and coalesced,
a namespace's on a share of kopf's handler threads.

An event of an owned object (handlers.repair_drift) asks for a repair of its CR. The
watch's selector is a label any tenant can put on its own objects, with a controller
reference to its own CR, whose uid it can read: each such event ran a full reconcile
under the CR's lock on kopf's threads, which every tenant's handlers share. A tenant
patching a hundred such ConfigMaps had those threads run its reconciles one at a time,
the others blocked on its CR's lock, and every other tenant's reconciles and repairs
queued behind them, ever longer at some 40 patches a second.

So a repair is asked here, on kopf's event loop, holding no thread:

- One repair per CR (namespace and name) waits or runs at once. Asked while the CR's
  waits, it joins it: a repair reads the CR and its objects only once it runs. Asked
  while it runs (it may have read an object before the edit), it runs once more at its
  end, once however often it was asked. A CR's events cost at most one repair running
  and one to come.
- Keyed by name, not by the uid an event's owner reference names: whoever writes the
  object writes that uid, and one object rewritten with a new uid each time would be a
  new repair each time. A repair reads the CR of the name when it runs.
- The repairs run on kopf's own handler threads (``executor``; they talk to the API
  server alone, as the handlers there do), at most ``REPAIRS`` at once and
  ``REPAIRS_PER_NAMESPACE`` of one namespace's. A repair past either waits for a slot in
  asyncio, and a freed slot goes round the waiting namespaces in turn (fair_slots.py):
  a namespace's repair waits for about one round of the others' repairs, never for
  their backlog. A repair run once more takes its turn again, at the back of its
  namespace's: a CR whose objects change without pause does not keep a slot for good.
- A repair waits on its CR's lock (a spec reconcile, the daemon's or a pod sync's
  writes of the same CR) on its thread; only one repair of a CR at once can, so no
  more than one of its namespace's slots waits on any one CR.

Not on the pod syncs' pool (pod_sync_pool.py): its slots are held for up to a sync's
deadline by tenants whose pods answer slowly, and a repair needs no pod at all.

The queue is the one the pod syncs' is too (coalesced_jobs.py), run on kopf's threads
and with a repair's run once more at the back of its namespace's turn.

Used from one event loop (kopf's): the slots and the repairs are kept on it, without a
lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from slopilot.operator.coalesced_jobs import CoalescedJobs, Job
from slopilot.operator.fair_slots import FairSlots
from slopilot.operator.settings import HANDLER_THREADS

log = logging.getLogger(__name__)

REPAIRS = HANDLER_THREADS // 2
"""Drift repairs of every namespace at once, on kopf's ``HANDLER_THREADS``: the other
half is left to the spec reconciles (a quarter, spec_reconciles.py), deletions and
timers, however many objects change."""
REPAIRS_PER_NAMESPACE = 2
"""Drift repairs of one namespace at once. A repair is one reconcile (a few API calls):
two keep up with a namespace's objects changing many times a second, coalesced per CR;
four namespaces at once are needed to fill ``REPAIRS``, whose freed slots still go
round every namespace in turn."""


class Repair(Job):
    """One CR's repair, waiting for a slot or under way (``started``)."""


class DriftRepairs:
    """The drift repairs and their slots (module docstring). ``executor``: the threads
    they run on (kopf's; None: the event loop's default)."""

    def __init__(self, total: int = REPAIRS, per_namespace: int = REPAIRS_PER_NAMESPACE, *,
                 executor: Executor | None = None) -> None:
        self.total, self.per_namespace = total, per_namespace
        self._slots = FairSlots(total, per_namespace)
        # A repair run once more waits for a slot again: a CR whose objects change
        # without pause keeps none for good (module docstring).
        self._repairs: CoalescedJobs[Repair] = CoalescedJobs(
            self._slots, executor, again_at_back=True, what="drift repair",
            not_done="drift not repaired", log=log)

    def running(self) -> int:
        """Repairs holding a slot now."""
        return self._slots.running()

    def waiting(self) -> int:
        """Repairs waiting for a slot."""
        return self._slots.waiting()

    def repairs(self) -> int:
        """CRs whose repair waits or runs."""
        return len(self._repairs)

    def ask(self, namespace: str, name: str, repair: Callable[[], object]) -> Repair:
        """The repair of CR ``namespace/name``: the one that waits (joined) or runs (run
        once more at its end), or ``repair()`` on a thread once a slot is free, in the
        caller's context variables (kopf posts events through them). After
        ``shutdown``, a repair already over."""
        loop = asyncio.get_running_loop()
        return self._repairs.ask((namespace, name), repair,
                                 lambda bound: Repair(namespace, name, bound, loop),
                                 again=True)

    async def settled(self) -> None:
        """Until no repair waits or runs, those asked meanwhile included."""
        await self._repairs.settled()

    def shutdown(self) -> None:
        """Every repair that waits for a slot withdrawn, none asked after run; one under
        way runs to its end (kopf's executor is kopf's to close)."""
        self._repairs.close()
