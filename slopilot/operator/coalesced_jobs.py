"""``CoalescedJobs``: one job per key at once, coalesced, each waiting for a slot of
``FairSlots`` in asyncio, then run on a thread.

The pod syncs (pod_sync_pool.py) and the drift repairs (drift_repairs.py) are each one
per CR at once, asked far more often than they can run; both are kept this way, each
with its own key, threads and words for the user:

- ``ask`` joins the key's job that waits: a job reads what it works on only once it
  runs, so whatever was asked since is in what it reads. Asked ``again`` while the job
  runs (it may have read too early), it runs once more at its end, once however often
  it was asked: a key costs at most one job running and one to come.
- A job waits for its slot in asyncio, holding no thread (fair_slots.py: the freed
  slots go round the waiting namespaces in turn). ``again_at_back``: a job run once
  more gives its slot back and waits for one again, at the back of its namespace's
  turn, so that a key asked without pause keeps no slot for good; else it runs again on
  the slot it holds.
- A job withdrawn while it waits (``withdraw``, ``close``) runs nothing and gives its
  place on; one under way runs to its end on its thread, holding its slot till then.
- A job's ``done`` is set once it ran (and ran again as asked) or was withdrawn, never
  with an exception: several wait on it, none of them its owner. What a run raises is
  logged, in the words and on the logger of the module that asked.

Used from one event loop (kopf's): the jobs and the slots are kept on it, without a
lock.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Generic, TypeVar

from slopilot.operator.fair_slots import FairSlots


class Job:
    """One key's job, waiting for a slot or under way (``started``)."""

    def __init__(self, namespace: str, name: str, run: Callable[[], object],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.namespace, self.name = namespace, name
        self.run = run
        self.started = False
        """Whether it holds a slot now (read from other threads too: a plain bool)."""
        self.again = False
        """Asked again while under way: run once more when it ends."""
        self.done: asyncio.Future[None] = loop.create_future()
        """Done once it ran (and ran again as asked), or was withdrawn; never with an
        exception."""
        self.task: asyncio.Task[None] | None = None

    @property
    def key(self) -> tuple[str, ...]:
        return (self.namespace, self.name)


J = TypeVar("J", bound=Job)


class CoalescedJobs(Generic[J]):
    """The jobs of one kind (module docstring), on ``slots``, run on ``executor`` (None:
    the event loop's default). ``what`` names a job in its task's name and in the log
    (``"pod sync"``); ``not_done`` says what a run that raised left undone."""

    def __init__(self, slots: FairSlots, executor: Executor | None, *, again_at_back: bool,
                 what: str, not_done: str, log: logging.Logger) -> None:
        self.slots = slots
        self._executor = executor
        self._again_at_back = again_at_back
        self._what, self._not_done, self._log = what, not_done, log
        self._jobs: dict[tuple[str, ...], J] = {}
        self._closed = False

    def __len__(self) -> int:
        """Keys whose job waits or runs."""
        return len(self._jobs)

    def get(self, key: tuple[str, ...]) -> J | None:
        return self._jobs.get(key)

    def ask(self, key: tuple[str, ...], run: Callable[[], object],
            build: Callable[[Callable[[], object]], J], *, again: bool) -> J:
        """``key``'s job that waits or runs (``again``: one under way runs once more),
        or ``build(...)``'s, its ``run`` given ``run`` in the caller's context variables
        (kopf posts events through them), run once a slot is free. After ``close``, a
        job already over."""
        found = self._jobs.get(key)
        if found is not None:
            if again and found.started:
                found.again = True
            return found
        job = build(functools.partial(contextvars.copy_context().run, run))
        if self._closed:
            job.done.set_result(None)
            return job
        self._jobs[key] = job
        job.task = asyncio.get_running_loop().create_task(
            self._serve(job), name=f"{self._what} of {job.namespace}/{job.name}")
        # Not in the task's own ``finally``: a task cancelled before its first step never
        # runs a line of its coroutine.
        job.task.add_done_callback(functools.partial(self._over, job))
        return job

    def withdraw(self, key: tuple[str, ...]) -> bool:
        """``key``'s job, where it still waits for a slot, ended with nothing run (its
        place given on); whether one was. One under way runs to its end."""
        job = self._jobs.get(key)
        if job is None or job.started or job.task is None:
            return False
        job.task.cancel()
        return True

    def close(self) -> None:
        """Every job that waits withdrawn, none asked after run, none run once more."""
        self._closed = True
        for job in list(self._jobs.values()):
            self.withdraw(job.key)

    async def settled(self) -> None:
        """Until no job waits or runs, those asked meanwhile included."""
        while self._jobs:
            await asyncio.wait([job.done for job in self._jobs.values()])

    async def _serve(self, job: J) -> None:
        while True:
            await self.slots.take(job.namespace, None)
            job.started = True
            try:
                await self._runs_on_slot(job)
            finally:
                # Only once the thread is done: never cancelled while it runs, but at the
                # loop's own end (the operator exited), where no count matters.
                self.slots.release(job.namespace)
            if not job.again or self._closed:
                return
            job.again, job.started = False, False  # to the back of its namespace's turn

    async def _runs_on_slot(self, job: J) -> None:
        """``job`` run, and again while asked so, unless each run more takes a slot anew."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self._executor, job.run)
            except Exception as exc:  # the API went away, or a bug: said
                self._log.warning("%s/%s: %s: %s: %s", job.namespace, job.name,
                                  self._not_done, type(exc).__name__, exc)
            if not job.again or self._closed or self._again_at_back:
                return
            job.again = False

    def _over(self, job: J, task: asyncio.Task[None]) -> None:
        """The job's task ended (run, or withdrawn): its key may be asked anew."""
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
        if not job.done.done():
            job.done.set_result(None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.error("%s/%s: the %s's task failed: %s: %s", job.namespace, job.name,
                            self._what, type(exc).__name__, exc)
