"""TuningPool: every tuning daemon's steps on one bounded pool of threads, a namespace's
on a share of it, the slots that free up going round the namespaces that wait, and a
wait for a slot holding no thread.

Each test runs one event loop (kopf's, in the operator); the steps block on a gate the
test opens, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from slopilot.operator.fair_slots import NotRun
from slopilot.operator.kubeapi import CONNECTION_POOL
from slopilot.operator.settings import HANDLER_THREADS
from slopilot.operator.tuning_pool import STEP_THREADS, STEPS_PER_NAMESPACE, TuningPool
from tests.support.waits import HANG_GUARD_S

YIELDS = 1000
"""Turns of the event loop an on-loop condition gets (each a ``sleep(0)``): far more
than any of them takes, and no clock in it."""


class Gate:
    """A step that stays on its thread until ``opened`` (a Prometheus answering slowly)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.entered: asyncio.Queue[None] = asyncio.Queue()
        self.opened = threading.Event()
        self.inside = 0
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1
        self.inside += 1
        self.loop.call_soon_threadsafe(self.entered.put_nowait, None)
        try:
            assert self.opened.wait(HANG_GUARD_S), "the test never opened the gate"
        finally:
            self.inside -= 1

    async def entry(self) -> None:
        """Until one more call is on a thread."""
        await asyncio.wait_for(self.entered.get(), HANG_GUARD_S)


async def on_loop(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition`` holds, which only the event loop's own turns bring about."""
    for _ in range(YIELDS):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not after {YIELDS} turns of the loop: {what}")


async def ended(*tasks: asyncio.Task[Any]) -> None:
    done, _ = await asyncio.wait(tasks, timeout=HANG_GUARD_S)
    assert len(done) == len(tasks), "a task never ended"


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def test_the_numbers_leave_room_to_other_namespaces_and_fit_the_api_connections() -> None:
    assert 1 <= STEPS_PER_NAMESPACE <= STEP_THREADS // 4  # one namespace: a quarter at most
    # Every step and every kopf handler talk to the API server at once, each on a
    # connection of the pool kubeapi.py keeps: past it urllib3 opens and drops one a call
    # (the pod syncs' threads too: test_pod_sync_pool.py).
    assert STEP_THREADS + HANDLER_THREADS <= CONNECTION_POOL


def test_a_namespace_past_its_share_waits_and_another_namespace_runs() -> None:
    async def main() -> None:
        pool = TuningPool(threads=3, per_namespace=2)
        gate = Gate()
        held = [asyncio.create_task(pool.lane("team-a").run(gate)) for _ in range(5)]
        await gate.entry()
        await gate.entry()
        await on_loop(lambda: pool.waiting() == 3, "team-a's three others waiting")
        assert pool.running() == 2
        assert await asyncio.wait_for(pool.lane("team-b").run(lambda: "b"), HANG_GUARD_S) \
            == "b"
        assert gate.runs == 2  # team-a's three others still wait, on no thread
        gate.opened.set()
        await ended(*held)
        assert gate.runs == 5 and pool.running() == 0 and pool.waiting() == 0
        pool.shutdown()

    run(main)


def test_the_threads_are_bounded_whatever_the_namespaces() -> None:
    async def main() -> None:
        pool = TuningPool(threads=2, per_namespace=1)
        gate = Gate()
        held = [asyncio.create_task(pool.lane(f"team-{i}").run(gate)) for i in range(6)]
        await gate.entry()
        await gate.entry()
        await on_loop(lambda: pool.waiting() == 4, "four namespaces waiting")
        assert pool.running() == 2 and gate.runs == 2
        gate.opened.set()
        await ended(*held)
        assert gate.runs == 6
        pool.shutdown()

    run(main)


def test_a_namespace_of_many_crs_delays_anothers_step_by_one_of_its_own() -> None:
    """Fifty CRs of team-a queued before team-b's one: a slot first come, first served
    made team-b wait for all fifty. The freed slot goes to the namespaces in turn."""
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        gate = Gate()
        holder = asyncio.create_task(pool.lane("team-a").run(gate))
        await gate.entry()
        order: list[str] = []
        a_steps = [asyncio.create_task(pool.lane("team-a").run(
            functools.partial(order.append, f"a{i}"))) for i in range(50)]
        await on_loop(lambda: pool.waiting() == 50, "team-a's fifty waiting")
        b_step = asyncio.create_task(pool.lane("team-b").run(lambda: order.append("b")))
        await on_loop(lambda: pool.waiting() == 51, "team-b's step waiting")
        gate.opened.set()
        await ended(holder, b_step, *a_steps)
        assert order[:2] == ["a0", "b"], order[:5]
        assert order[2:] == [f"a{i}" for i in range(1, 50)]  # in turn within team-a
        pool.shutdown()

    run(main)


def test_a_wait_told_to_stop_runs_nothing_and_holds_no_place() -> None:
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        gate = Gate()
        holder = asyncio.create_task(pool.lane("team-a").run(gate))
        await gate.entry()
        stop = False
        ran: list[str] = []
        waiting = asyncio.create_task(pool.lane("team-b").run(
            lambda: ran.append("stopped one"), until=lambda: stop))
        await on_loop(lambda: pool.waiting() == 1, "team-b's step waiting")
        stop = True
        gate.opened.set()  # the slot frees as the stop is noticed: it is not taken
        await ended(holder, waiting)
        assert isinstance(waiting.exception(), NotRun)
        assert ran == [] and pool.running() == 0 and pool.waiting() == 0
        with pytest.raises(NotRun):  # told already: not even queued
            await pool.lane("team-b").run(lambda: ran.append("late"), until=lambda: True)
        assert await pool.lane("team-b").run(lambda: "next") == "next"
        assert ran == []
        pool.shutdown()

    run(main)


def test_a_cancelled_wait_gives_its_place_on() -> None:
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        gate = Gate()
        holder = asyncio.create_task(pool.lane("team-a").run(gate))
        await gate.entry()
        ran: list[str] = []
        first = asyncio.create_task(pool.lane("team-b").run(lambda: ran.append("first")))
        second = asyncio.create_task(pool.lane("team-c").run(lambda: ran.append("second")))
        await on_loop(lambda: pool.waiting() == 2, "two steps waiting")
        first.cancel()
        await ended(first)
        assert pool.waiting() == 1
        gate.opened.set()
        await ended(holder, second)
        assert ran == ["second"] and pool.running() == 0
        pool.shutdown()

    run(main)


def test_a_step_whose_waiter_is_cancelled_keeps_its_slot_until_its_thread_ends() -> None:
    """kopf cancels a daemon that does not stop in time; its step goes on on the thread,
    which no other step may have meanwhile."""
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        gate = Gate()
        cancelled = asyncio.create_task(pool.lane("team-a").run(gate))
        await gate.entry()
        cancelled.cancel()
        await ended(cancelled)
        assert cancelled.cancelled() and gate.inside == 1
        ran: list[str] = []
        after = asyncio.create_task(pool.lane("team-b").run(lambda: ran.append("after")))
        await on_loop(lambda: pool.waiting() == 1, "the next step waiting")
        assert pool.running() == 1 and ran == []
        gate.opened.set()
        await ended(after)
        assert ran == ["after"] and gate.inside == 0
        pool.shutdown()

    run(main)


def test_a_lanes_call_after_a_cancelled_one_waits_for_it_to_end() -> None:
    """One daemon's calls never overlap: its ending, after a step whose await kopf
    cancelled, runs once that step is over (the daemon's own thread ran them in turn)."""
    async def main() -> None:
        pool = TuningPool(threads=2, per_namespace=2)
        lane = pool.lane("team-a")
        gate = Gate()
        step = asyncio.create_task(lane.run(gate))
        await gate.entry()
        step.cancel()
        await ended(step)
        seen: list[int] = []
        ending = asyncio.create_task(lane.run(lambda: seen.append(gate.inside)))
        for _ in range(YIELDS):
            await asyncio.sleep(0)
        assert pool.running() == 1 and pool.waiting() == 0 and not ending.done()
        gate.opened.set()
        await ended(ending)
        assert seen == [0]
        pool.shutdown()

    run(main)


def test_a_step_raises_on_its_daemon_and_gives_its_slot_back() -> None:
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)

        def broken() -> None:
            raise RuntimeError("the API went away")

        with pytest.raises(RuntimeError, match="the API went away"):
            await pool.lane("team-a").run(broken)
        assert await pool.lane("team-a").run(lambda: "next") == "next"
        await on_loop(lambda: pool.running() == 0, "the slot given back")
        pool.shutdown()

    run(main)


def test_the_callers_context_variables_reach_the_thread() -> None:
    """kopf's event posting (``kopf.info``, decision_events.py) finds its queue through
    context variables set in the daemon's task."""
    where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")

    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        where.set("the daemon's")
        assert await pool.lane("team-a").run(where.get) == "the daemon's"
        pool.shutdown()

    run(main)


def test_the_pools_threads_are_named_for_it() -> None:
    async def main() -> None:
        pool = TuningPool(threads=1, per_namespace=1)
        name = await pool.lane("team-a").run(lambda: threading.current_thread().name)
        assert name.startswith("tuning-step")
        pool.shutdown()

    run(main)


@pytest.mark.parametrize(("per_namespace", "threads"), [(0, 4), (3, 2)])
def test_a_pool_that_runs_nothing_or_a_share_past_all_is_refused(
        per_namespace: int, threads: int) -> None:
    with pytest.raises(ValueError, match="expected 1 <= per_namespace <= threads"):
        TuningPool(threads=threads, per_namespace=per_namespace)


def test_the_security_model_states_the_numbers_the_operator_runs_with() -> None:
    from tests.docs.test_doc_references import ROOT

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    for said in (f"one pool of {STEP_THREADS} threads (`STEP_THREADS`",
                 f"at most {STEPS_PER_NAMESPACE} of one namespace at once "
                 "(`STEPS_PER_NAMESPACE`)"):
        assert said in text, said
