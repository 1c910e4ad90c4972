"""CoalescedJobs: one job per key at once, joined while it waits, run once more at its
end when asked again while it runs (on its slot, or at the back of its namespace's
turn), withdrawn while it waits, its ``done`` never an exception.

Each test runs one event loop; the jobs block on a gate the test opens, so nothing here
depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from slopilot.operator.coalesced_jobs import CoalescedJobs, Job
from slopilot.operator.fair_slots import FairSlots
from tests.operator.test_tuning_pool import Gate, on_loop, run
from tests.support.waits import HANG_GUARD_S

log = logging.getLogger("test.coalesced_jobs")
ASKER: contextvars.ContextVar[str] = contextvars.ContextVar("asker", default="nobody")


def jobs(executor: ThreadPoolExecutor, *, total: int = 1, per_namespace: int = 1,
         again_at_back: bool = False) -> CoalescedJobs[Job]:
    return CoalescedJobs(FairSlots(total, per_namespace), executor,
                         again_at_back=again_at_back, what="test job",
                         not_done="nothing done", log=log)


def ask(queue: CoalescedJobs[Job], namespace: str, name: str, job: Callable[[], object],
        *, again: bool = False) -> Job:
    loop = asyncio.get_running_loop()
    return queue.ask((namespace, name), job,
                     lambda bound: Job(namespace, name, bound, loop), again=again)


async def over(*asked: Job) -> None:
    done, _ = await asyncio.wait([a.done for a in asked], timeout=HANG_GUARD_S)
    assert len(done) == len(asked), "a job never ended"


def gated(gate: Gate, order: list[str], label: str) -> Callable[[], None]:
    def job() -> None:
        order.append(label)
        gate()
    return job


async def held(queue: CoalescedJobs[Job]) -> tuple[Gate, list[str], Job]:
    """``queue``'s one slot held by team-a's slow job (``holder``) until ``gate`` opens;
    ``order`` lists the jobs as they run."""
    gate, order = Gate(), list[str]()
    holder = ask(queue, "team-a", "slow", gated(gate, order, "slow"))
    await gate.entry()
    return gate, order, holder


@pytest.mark.parametrize(("again_at_back", "expected"), [
    (False, ["a", "a", "b"]),  # run again on the slot it holds
    (True, ["a", "b", "a"]),  # run again after its namespace's other waiting job
])
def test_asked_again_while_it_runs_it_runs_once_more_on_its_slot_or_at_the_back(
        again_at_back: bool, expected: list[str]) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=2) as executor:
            queue = jobs(executor, again_at_back=again_at_back)
            gate, order = Gate(), list[str]()
            first = ask(queue, "team-a", "a", gated(gate, order, "a"))
            await gate.entry()
            other = ask(queue, "team-a", "b", gated(gate, order, "b"))
            await on_loop(lambda: queue.slots.waiting() == 1, "b waiting")
            # Asked without ``again`` while under way: joined, nothing more to run.
            assert ask(queue, "team-a", "a", gated(gate, order, "x")) is first
            for _ in range(3):  # however often asked: once more
                assert ask(queue, "team-a", "a", gated(gate, order, "x"), again=True) \
                    is first
            gate.opened.set()
            await over(first, other)
            assert order == expected
            assert len(queue) == 0 and queue.slots.running() == 0

    run(main)


def test_asked_while_it_waits_it_is_joined_and_runs_once_in_its_first_askers_context(
        ) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=2) as executor:
            queue = jobs(executor)
            gate, order, holder = await held(queue)
            ASKER.set("first")
            waiting = ask(queue, "team-b", "b", lambda: order.append(ASKER.get()))
            ASKER.set("second")
            assert ask(queue, "team-b", "b", lambda: order.append("again"),
                       again=True) is waiting
            assert len(queue) == 2
            gate.opened.set()
            await over(holder, waiting)
            assert order == ["slow", "first"]

    run(main)


def test_withdrawn_while_it_waits_it_runs_nothing_and_gives_its_place_on() -> None:
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=2) as executor:
            queue = jobs(executor)
            gate, order, holder = await held(queue)
            withdrawn = ask(queue, "team-b", "b", lambda: order.append("b"))
            after = ask(queue, "team-c", "c", lambda: order.append("c"))
            await on_loop(lambda: queue.slots.waiting() == 2, "b and c waiting")
            assert not queue.withdraw(("team-a", "slow"))  # under way: runs to its end
            assert not queue.withdraw(("team-z", "none"))
            assert queue.withdraw(("team-b", "b"))
            await over(withdrawn)
            assert withdrawn.done.result() is None and queue.get(("team-b", "b")) is None
            gate.opened.set()
            await over(holder, after)
            assert order == ["slow", "c"]

    run(main)


def test_a_run_that_raises_is_logged_and_its_done_holds_no_exception(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise ConnectionError("the API went away")

    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = jobs(executor)
            failed = ask(queue, "team-a", "chat", broken)
            await over(failed)
            assert failed.done.result() is None and len(queue) == 0

    with caplog.at_level(logging.WARNING, logger=log.name):
        run(main)
    assert "team-a/chat: nothing done: ConnectionError: the API went away" in caplog.text


def test_closed_it_withdraws_the_waiting_runs_none_asked_after_and_none_again() -> None:
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=2) as executor:
            queue = jobs(executor)
            gate, order, holder = await held(queue)
            assert ask(queue, "team-a", "slow", gated(gate, order, "x"), again=True) \
                is holder
            waiting = ask(queue, "team-b", "b", lambda: order.append("b"))
            queue.close()
            await over(waiting)
            late = ask(queue, "team-c", "c", lambda: order.append("c"))
            assert late.done.done() and late.task is None
            gate.opened.set()
            await over(holder)
            assert order == ["slow"]

    run(main)


def test_a_task_cancelled_before_its_first_step_still_ends_its_job() -> None:
    """The task's done-callback, not its coroutine, ends the job: a task cancelled
    before it ran a line still sets ``done`` and frees the key."""
    async def main() -> None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = jobs(executor)
            ran: list[str] = []
            asked = ask(queue, "team-a", "chat", functools.partial(ran.append, "ran"))
            assert queue.withdraw(("team-a", "chat"))  # before the loop's next turn
            await over(asked)
            assert ran == [] and len(queue) == 0 and queue.slots.running() == 0

    run(main)
