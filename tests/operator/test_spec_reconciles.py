"""A tenant's spec edits take no more than its share of kopf's threads: the spec
reconciles of every namespace go through fair slots (spec_reconciles.py), and a quiet
namespace's reconcile waits for about one round of the others', never their backlog."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
import pytest

from slopilot.operator import handlers
from slopilot.operator.spec_reconciles import SpecReconciles
from tests.support.waits import HANG_GUARD_S

log = logging.getLogger("test")
reconcile_llmdeployment: Any = handlers.reconcile_llmdeployment


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(8, thread_name_prefix="kopf-standin") as pool:
        yield pool


async def until(condition: Callable[[], bool]) -> None:
    """Wait on the loop for ``condition`` (set by the executor's threads)."""
    async with asyncio.timeout(HANG_GUARD_S):
        while not condition():
            await asyncio.sleep(0.001)


def body(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"{namespace}-{name}"},
            "spec": {}}


def test_a_flooding_namespace_holds_its_share_and_a_quiet_one_runs_beside_it(
        threads: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    running: list[str] = []

    def noisy(i: int) -> int:
        running.append(f"noisy-{i}")
        gate.wait(HANG_GUARD_S)
        return i

    async def scenario() -> None:
        slots = SpecReconciles(total=3, per_namespace=2, executor=threads)
        flood = [asyncio.create_task(slots.run("noisy", functools.partial(noisy, i)))
                 for i in range(20)]
        await until(lambda: len(running) == 2)
        # The noisy namespace holds two slots (its share); the quiet one's reconcile runs
        # on the third while the other eighteen wait.
        assert await slots.run("quiet", lambda: "quiet") == "quiet"
        assert len(running) == 2 and slots.waiting() == 18
        gate.set()
        assert sorted(await asyncio.gather(*flood)) == list(range(20))
        assert slots.running() == 0

    asyncio.run(scenario())


def test_a_cancelled_wait_gives_its_slot_back_only_once_its_thread_ends(
        threads: ThreadPoolExecutor) -> None:
    """kopf cancels a handler as it stops: the reconcile on its thread still runs to its
    end, and its slot is not handed on before (two would run where one may)."""
    gate = threading.Event()
    started = threading.Event()

    def held() -> None:
        started.set()
        gate.wait(HANG_GUARD_S)

    async def scenario() -> None:
        slots = SpecReconciles(total=1, per_namespace=1, executor=threads)
        task = asyncio.create_task(slots.run("a", held))
        await until(started.is_set)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert slots.running() == 1
        gate.set()
        await until(lambda: slots.running() == 0)

    asyncio.run(scenario())


def test_a_reconcile_raises_what_its_work_raises(threads: ThreadPoolExecutor) -> None:
    def refused() -> None:
        raise kopf.TemporaryError("a name taken", delay=30)

    async def scenario() -> None:
        slots = SpecReconciles(total=1, per_namespace=1, executor=threads)
        with pytest.raises(kopf.TemporaryError, match="a name taken"):
            await slots.run("a", refused)
        assert slots.running() == 0

    asyncio.run(scenario())


def test_the_spec_handler_runs_the_reconcile_on_a_slot_of_its_namespace(
        threads: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler kopf calls holds no thread while it waits: it asks the CR's namespace
    for a slot, and the reconcile runs on the executor's threads."""
    ran: list[tuple[str, str]] = []

    def reconcile_spec(body: Any, memo: Any, logger: Any) -> None:
        ran.append((body["metadata"]["namespace"], threading.current_thread().name))

    monkeypatch.setattr(handlers, "reconcile_spec", reconcile_spec)

    async def scenario() -> None:
        slots = SpecReconciles(total=1, per_namespace=1, executor=threads)
        memo = kopf.Memo(spec_reconciles=slots)
        await reconcile_llmdeployment(body=body("team-a", "chat"), memo=memo, logger=log)
        assert slots.running() == 0

    asyncio.run(scenario())
    assert len(ran) == 1 and ran[0][0] == "team-a"
    assert ran[0][1].startswith("kopf-standin")
