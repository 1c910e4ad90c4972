"""PodSyncPool: the pod syncs on a pool of their own, a namespace's on a share of it, a
sync past either waiting for a slot (holding no thread) rather than refused, the slots
that free up going round the namespaces that wait, one sync per CR at once.

Each test runs one event loop (kopf's, in the operator); the syncs block on a gate the
test opens, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading

import pytest

from slopilot.operator.kubeapi import CONNECTION_POOL
from slopilot.operator.pod_sync_pool import (
    SYNC_THREADS,
    SYNCS_PER_NAMESPACE,
    PodSyncPool,
    Ticket,
    Waited,
)
from slopilot.operator.settings import HANDLER_THREADS
from slopilot.operator.tuning_pool import STEP_THREADS
from tests.operator.test_tuning_pool import Gate, on_loop, run
from tests.support.waits import HANG_GUARD_S


async def over(*tickets: object) -> None:
    """Until each ticket's sync is over."""
    futures = [t.done for t in tickets]  # type: ignore[attr-defined]
    done, _ = await asyncio.wait(futures, timeout=HANG_GUARD_S)
    assert len(done) == len(futures), "a sync never ended"


async def held_pool() -> tuple[PodSyncPool, Gate, Ticket]:
    """A pool of one slot, held by team-a's slow sync (``holder``) until ``gate`` opens."""
    pool = PodSyncPool(threads=1, per_namespace=1)
    gate = Gate()
    holder = pool.ask("team-a", "slow", "uid-slow", gate)
    await gate.entry()
    return pool, gate, holder


def test_the_numbers_leave_room_to_other_namespaces_and_fit_the_api_connections() -> None:
    assert 1 <= SYNCS_PER_NAMESPACE <= SYNC_THREADS // 4  # one namespace: a quarter at most
    # Every sync, tuning step and kopf handler talk to the API server at once, each on a
    # connection of the pool kubeapi.py keeps: past it urllib3 opens and drops one a call.
    assert SYNC_THREADS + STEP_THREADS + HANDLER_THREADS <= CONNECTION_POOL


def test_a_namespace_past_its_share_waits_and_another_namespace_runs() -> None:
    async def main() -> None:
        pool = PodSyncPool(threads=3, per_namespace=2)
        gate = Gate()
        held = [pool.ask("team-a", f"chat-{i}", f"uid-{i}", gate) for i in range(5)]
        await gate.entry()
        await gate.entry()
        await on_loop(lambda: pool.waiting() == 3, "team-a's three others waiting")
        assert pool.running() == 2
        ran: list[str] = []
        await over(pool.ask("team-b", "chat", "uid-b", lambda: ran.append("b")))
        assert ran == ["b"] and gate.runs == 2  # team-a's others still wait, on no thread
        assert "namespace team-a runs the most syncs one namespace runs at once (2, " \
            "SYNCS_PER_NAMESPACE)" in pool.why_waiting("team-a")
        gate.opened.set()
        await over(*held)
        assert gate.runs == 5 and pool.running() == 0 and pool.waiting() == 0
        assert pool.syncs() == 0
        pool.shutdown()

    run(main)


def test_the_threads_are_bounded_whatever_the_namespaces() -> None:
    async def main() -> None:
        pool = PodSyncPool(threads=2, per_namespace=1)
        gate = Gate()
        held = [pool.ask(f"team-{i}", "chat", f"uid-{i}", gate) for i in range(6)]
        await gate.entry()
        await gate.entry()
        await on_loop(lambda: pool.waiting() == 4, "four namespaces waiting")
        assert pool.running() == 2 and gate.runs == 2
        assert "the operator's 2 pod syncs at once (SYNC_THREADS) are all under way" in \
            pool.why_waiting("team-5")
        gate.opened.set()
        await over(*held)
        assert gate.runs == 6
        pool.shutdown()

    run(main)


def test_a_namespace_of_many_crs_delays_anothers_sync_by_one_of_its_own() -> None:
    """Fifty CRs of team-a waiting before team-b's one: the freed slot goes to the
    namespaces in turn, so team-b's sync waits for one of team-a's, not fifty (a sync
    refused at every interval while the slow namespaces took each slot back waited for
    good)."""
    async def main() -> None:
        pool, gate, holder = await held_pool()
        order: list[str] = []
        a_syncs = [pool.ask("team-a", f"chat-{i}", f"uid-{i}",
                            functools.partial(order.append, f"a{i}")) for i in range(50)]
        await on_loop(lambda: pool.waiting() == 50, "team-a's fifty waiting")
        b_sync = pool.ask("team-b", "chat", "uid-b", lambda: order.append("b"))
        await on_loop(lambda: pool.waiting() == 51, "team-b's sync waiting")
        gate.opened.set()
        await over(holder, b_sync, *a_syncs)
        assert order[:2] == ["a0", "b"], order[:5]
        assert order[2:] == [f"a{i}" for i in range(1, 50)]  # in turn within team-a
        pool.shutdown()

    run(main)


def test_one_sync_per_cr_at_once_and_once_more_only_when_asked_again() -> None:
    async def main() -> None:
        pool = PodSyncPool(threads=2, per_namespace=2)
        gate = Gate()
        first = pool.ask("team-a", "chat", "uid-1", gate)
        await gate.entry()
        # The timer's, while the CR's own runs: the same sync, nothing more to run.
        assert pool.ask("team-a", "chat", "uid-1", gate) is first
        assert pool.running() == 1 and pool.waiting() == 0
        gate.opened.set()
        await over(first)
        assert gate.runs == 1
        gate.opened.clear()
        again = pool.ask("team-a", "chat", "uid-1", gate)
        await gate.entry()
        # A reconcile's, after an edit the sync under way may have read too early: twice
        # asked, one more sync does it, reading the CR then.
        for _ in range(2):
            assert pool.ask("team-a", "chat", "uid-1", gate, again=True) is again
        gate.opened.set()
        await over(again)
        assert gate.runs == 3 and pool.running() == 0
        # Another CR of the name (deleted and made again) is another sync.
        other = pool.ask("team-a", "chat", "uid-2", lambda: None)
        assert other is not again
        await over(other)
        pool.shutdown()

    run(main)


def test_a_sync_asked_again_while_it_waits_runs_once() -> None:
    """It reads the CR only once it runs: the edit is in what it reads."""
    async def main() -> None:
        pool, gate, holder = await held_pool()
        ran: list[str] = []
        waiting = pool.ask("team-b", "chat", "uid-b", lambda: ran.append("b"))
        assert pool.ask("team-b", "chat", "uid-b", lambda: ran.append("b2"),
                        again=True) is waiting
        gate.opened.set()
        await over(holder, waiting)
        assert ran == ["b"]
        pool.shutdown()

    run(main)


def test_a_sync_that_raises_is_logged_and_gives_its_slot_back(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        pool = PodSyncPool(threads=1, per_namespace=1)

        def broken() -> None:
            raise RuntimeError("the API went away")

        await over(pool.ask("team-a", "chat", "uid", broken))
        ran: list[str] = []
        await over(pool.ask("team-a", "other", "uid-2", lambda: ran.append("next")))
        assert ran == ["next"] and pool.running() == 0 and pool.syncs() == 0
        pool.shutdown()

    with caplog.at_level(logging.WARNING, logger="slopilot.operator.pod_sync_pool"):
        run(main)
    assert "team-a/chat: the pods' configs were not checked: RuntimeError: the API went " \
        "away" in caplog.text


def test_a_withdrawn_sync_runs_nothing_and_gives_its_place_on() -> None:
    """Its CR deleted (or its timer stopped) while it waits: it ends, nothing run, and
    the next namespace in turn gets the slot. One under way is not withdrawn."""
    async def main() -> None:
        pool, gate, holder = await held_pool()
        ran: list[str] = []
        gone = pool.ask("team-b", "chat", "uid-b", lambda: ran.append("gone"))
        after = pool.ask("team-c", "chat", "uid-c", lambda: ran.append("after"))
        await on_loop(lambda: pool.waiting() == 2, "two syncs waiting")
        assert pool.withdraw("team-b", "chat", "uid-b")
        await over(gone)
        assert pool.waiting() == 1 and pool.syncs() == 2
        assert not pool.withdraw("team-a", "slow", "uid-slow")  # under way: runs on
        assert not pool.withdraw("team-d", "chat", "uid-d")  # never asked
        gate.opened.set()
        await over(holder, after)
        assert ran == ["after"] and gate.runs == 1 and pool.running() == 0
        pool.shutdown()

    run(main)


def test_a_sync_withdrawn_before_its_task_first_ran_ends_all_the_same() -> None:
    """Withdrawn in the same turn of the loop it was asked in (a deletion right after
    the reconcile's ask): its task never ran a line, and it still ends, its CR free to
    ask anew."""
    async def main() -> None:
        pool = PodSyncPool(threads=1, per_namespace=1)
        ran: list[str] = []
        ticket = pool.ask("team-a", "chat", "uid", lambda: ran.append("gone"))
        assert pool.withdraw("team-a", "chat", "uid")
        await over(ticket)
        assert ran == [] and pool.syncs() == 0 and pool.running() == 0
        await over(pool.ask("team-a", "chat", "uid", lambda: ran.append("anew")))
        assert ran == ["anew"]
        pool.shutdown()

    run(main)


def test_a_waiter_is_told_when_the_sync_is_late_and_stops_when_told() -> None:
    async def main() -> None:
        pool, gate, holder = await held_pool()
        waiting = pool.ask("team-b", "chat", "uid-b", lambda: None)
        await on_loop(lambda: pool.waiting() == 1, "team-b's sync waiting")
        loop = asyncio.get_running_loop()
        # Past its ``late_at`` already: said at once, no clock waited on.
        assert await pool.wait(waiting, late_at=loop.time() - 1) is Waited.LATE
        assert await pool.wait(waiting, until=lambda: True) is Waited.STOPPED
        assert pool.waiting() == 1  # a stop ends the wait only: the sync still waits
        # Under way, a sync is never late: the second look at ``until`` ends the wait.
        looks = iter((False, True))
        assert await pool.wait(holder, late_at=loop.time() - 1,
                               until=lambda: next(looks)) is Waited.STOPPED
        gate.opened.set()
        assert await asyncio.wait_for(pool.wait(waiting), HANG_GUARD_S) is Waited.ENDED
        assert await pool.wait(holder) is Waited.ENDED
        pool.shutdown()

    run(main)


def test_shutdown_withdraws_the_waiting_syncs_and_runs_none_asked_after() -> None:
    async def main() -> None:
        pool, gate, holder = await held_pool()
        ran: list[str] = []
        waiting = [pool.ask(f"team-{i}", "chat", f"uid-{i}", lambda: ran.append("late"))
                   for i in range(3)]
        await on_loop(lambda: pool.waiting() == 3, "three syncs waiting")
        pool.shutdown()
        await over(*waiting)
        assert pool.waiting() == 0 and not holder.done.done()  # under way: runs on
        after = pool.ask("team-z", "chat", "uid-z", lambda: ran.append("after"))
        assert after.done.done()
        gate.opened.set()
        await over(holder)
        assert ran == [] and gate.runs == 1 and pool.running() == 0 and pool.syncs() == 0

    run(main)


def test_the_askers_context_variables_reach_the_thread_named_for_the_pool() -> None:
    """kopf's event posting (the handler's logger) finds its queue through context
    variables set where the handler runs."""
    where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")

    async def main() -> None:
        pool = PodSyncPool(threads=1, per_namespace=1)
        where.set("the timer's")
        seen: list[tuple[str, str]] = []
        await over(pool.ask("team-a", "chat", "uid", lambda: seen.append(
            (where.get(), threading.current_thread().name))))
        assert seen[0][0] == "the timer's" and seen[0][1].startswith("pod-sync")
        pool.shutdown()

    run(main)


def test_a_handler_on_another_thread_asks_through_the_loop() -> None:
    """A reconcile runs on one of kopf's threads: it asks, and returns at once."""
    where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = PodSyncPool(threads=1, per_namespace=1, loop=loop)
        seen: list[str] = []

        def reconcile() -> None:
            where.set("the reconcile's")
            pool.ask_threadsafe("team-a", "chat", "uid", lambda: seen.append(where.get()),
                                again=True)

        await asyncio.wait_for(loop.run_in_executor(None, reconcile), HANG_GUARD_S)
        await on_loop(lambda: seen == ["the reconcile's"], "the asked sync run")
        await on_loop(lambda: pool.syncs() == 0, "the sync over")
        pool.shutdown()
        with pytest.raises(RuntimeError, match="no event loop to ask on"):
            PodSyncPool(threads=1, per_namespace=1).ask_threadsafe(
                "team-a", "chat", "uid", lambda: None)

    run(main)


@pytest.mark.parametrize(("per_namespace", "threads"), [(0, 4), (3, 2)])
def test_a_pool_that_runs_nothing_or_a_share_past_all_is_refused(
        per_namespace: int, threads: int) -> None:
    with pytest.raises(ValueError, match="expected 1 <= per_namespace <= threads"):
        PodSyncPool(threads=threads, per_namespace=per_namespace)


def test_the_operator_runs_kopfs_handlers_on_that_many_threads() -> None:
    """Unset, kopf's pool was asyncio's default, min(32, CPUs + 4): 6 on a 2-CPU pod."""
    import kopf

    from slopilot.operator.settings import configure

    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.execution.max_workers == HANDLER_THREADS


def test_the_security_model_states_the_numbers_the_operator_runs_with() -> None:
    from slopilot.operator.pod_syncs import SYNC_WAIT_SAID_S
    from tests.docs.test_doc_references import ROOT

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    for said in (f"one pool of {HANDLER_THREADS} threads (`HANDLER_THREADS`",
                 f"a pool of {SYNC_THREADS} threads of their own (`SYNC_THREADS`",
                 f"at most {SYNCS_PER_NAMESPACE} of one namespace at once "
                 "(`SYNCS_PER_NAMESPACE`)",
                 f"once a sync has waited {SYNC_WAIT_SAID_S:g} s"):
        assert said in text, said
