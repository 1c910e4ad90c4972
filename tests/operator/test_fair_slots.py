"""FairSlots: the slots the operator's pools hand out (the tuning steps', the pod
syncs'), where a wait ends just as its slot comes. The pools' own tests cover the rest
(test_tuning_pool.py, test_pod_sync_pool.py). Every step here runs on one event loop,
the slots given back by the test itself: nothing waits on a thread or a clock."""

from __future__ import annotations

import asyncio

import pytest

from slopilot.operator.fair_slots import FairSlots, NotRun
from tests.operator.test_tuning_pool import on_loop, run


def test_a_wait_cancelled_as_its_slot_comes_passes_the_slot_on() -> None:
    """The slot granted, the waiter not yet resumed (a pod sync withdrawn then, its CR
    deleted): the slot goes to the next namespace in turn, not lost."""
    async def main() -> None:
        slots = FairSlots(total=1, per_namespace=1)
        await slots.take("team-a", None)
        granted = asyncio.create_task(slots.take("team-b", None))
        after = asyncio.create_task(slots.take("team-c", None))
        await on_loop(lambda: slots.waiting() == 2, "two namespaces waiting")
        slots.release("team-a")  # team-b's now, its task not yet resumed
        granted.cancel()
        await on_loop(after.done, "team-c given the slot team-b's wait left")
        assert granted.cancelled() and after.exception() is None
        assert slots.running() == 1 and slots.held("team-c") == 1 and slots.waiting() == 0

    run(main)


def test_a_stop_as_the_slot_comes_passes_it_on_too() -> None:
    async def main() -> None:
        slots = FairSlots(total=1, per_namespace=1)
        await slots.take("team-a", None)
        stop = False
        stopped = asyncio.create_task(slots.take("team-b", lambda: stop))
        after = asyncio.create_task(slots.take("team-c", None))
        await on_loop(lambda: slots.waiting() == 2, "two namespaces waiting")
        stop = True
        slots.release("team-a")
        await on_loop(after.done, "team-c given the slot")
        assert isinstance(stopped.exception(), NotRun)
        assert slots.held("team-c") == 1 and slots.namespaces_waiting() == 0

    run(main)


@pytest.mark.parametrize(("per_namespace", "total"), [(0, 4), (3, 2)])
def test_slots_that_hand_nothing_out_or_a_share_past_all_are_refused(
        per_namespace: int, total: int) -> None:
    with pytest.raises(ValueError, match="expected 1 <= per_namespace <= total"):
        FairSlots(total=total, per_namespace=per_namespace)
