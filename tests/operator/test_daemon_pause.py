"""The tuning daemon's pause between ticks: woken by a stop, and leaves no task behind.

kopf's ``await stopped.wait(n)`` runs its timer in a task of its own; when kopf cancels
the daemon as that timer runs out, the task ends in a TimeoutError nobody awaits, and kopf
re-raises it when the operator exits (seen in CI as a failed clean exit).
"""
from __future__ import annotations

import asyncio
import contextlib

from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

from slopilot.operator.daemon_pause import pause
from tests.support.waits import HANG_GUARD_S


def _stopper() -> tuple[FlagSetter[object], AsyncFlagWaiter[object]]:
    setter: FlagSetter[object] = FlagSetter()
    return setter, AsyncFlagWaiter(setter)


def test_the_pause_spawns_no_task_that_could_outlive_its_daemon() -> None:
    async def main() -> set[asyncio.Task[object]]:
        _, stopped = _stopper()
        before = asyncio.all_tasks()
        waiting = asyncio.create_task(pause(stopped, 30.0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        spawned = asyncio.all_tasks() - before - {waiting}
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return spawned

    assert asyncio.run(main()) == set()


def test_a_stop_ends_the_pause_at_once() -> None:
    async def main() -> bool:
        setter, stopped = _stopper()
        waiting = asyncio.create_task(pause(stopped, 3600.0))
        await asyncio.sleep(0)
        setter.set()
        # Bounded so that a pause deaf to the stop fails the test instead of hanging it.
        done, _ = await asyncio.wait({waiting}, timeout=HANG_GUARD_S)
        return waiting in done

    assert asyncio.run(main())


def test_cancelling_the_pause_leaves_no_error_behind() -> None:
    errors: list[BaseException] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, ctx: errors.append(ctx.get("exception") or RuntimeError(ctx)))
        _, stopped = _stopper()
        for _ in range(50):
            waiting = asyncio.create_task(pause(stopped, 0.0))
            await asyncio.sleep(0)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        others = asyncio.all_tasks() - {asyncio.current_task()}
        assert not others, others

    asyncio.run(main())
    assert errors == []


def test_a_pause_of_nothing_returns() -> None:
    async def main() -> None:
        _, stopped = _stopper()
        await pause(stopped, 0.0)

    asyncio.run(main())
