"""The simulator workers' turns: waiting callers served by tenant (a namespace) in turn.

Every deployment an operator runs shares its simulator processes; served first come,
first served, a namespace's call queued behind another namespace's K calls waited for all
K (and past its queue limit went without the twin). Waits here end on conditions: the
calls hold their process until the test lets them go (``tests/support/held_calls.py``).
"""

from __future__ import annotations

import os
import pathlib
import threading

import pytest

from slopilot.engine.alert_factors import DEFAULT_FACTORS
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.ports import SimulatorBusy
from slopilot.tuner.sim.adapters import SimOffline
from slopilot.tuner.sim.fair_turns import FairTurns
from slopilot.tuner.sim.worker import (
    DEFAULT_TENANT,
    SimTimeout,
    SimWorker,
    WorkerOffline,
    WorkerPlanner,
    WorkerTwin,
)
from slopilot.tuner.study.space import SearchSpace
from tests.support.held_calls import Held, served_order
from tests.support.waits import HANG_GUARD_S, wait_for

TINY = load_scenario("tiny-cpu")


def test_a_quiet_namespace_waits_for_one_noisy_call_not_for_all_it_queued(
        tmp_path: pathlib.Path) -> None:
    # First come, first served the quiet call ran after all K (measured on the code
    # before: ['noisy1', ..., 'noisy5', 'quiet']).
    k = 4
    with SimWorker() as w:
        running = Held(w, tmp_path, "noisy0", tenant="noisy")
        noisy = [Held(w, tmp_path, f"noisy{i}", tenant="noisy", queued=i)
                 for i in range(1, k + 1)]
        quiet = Held(w, tmp_path, "quiet", tenant="quiet", queued=k + 1)
        order = served_order(running, [*noisy, quiet])
    assert order == ["quiet", *(f"noisy{i}" for i in range(1, k + 1))]


def test_a_call_past_its_time_frees_its_turn_for_another_namespace(
        tmp_path: pathlib.Path) -> None:
    with SimWorker() as w:
        outcome: list[object] = []

        def forever() -> None:
            try:
                w.call(_forever, timeout_s=1.0, tenant="noisy")
            except SimTimeout as exc:
                outcome.append(exc)

        thread = threading.Thread(target=forever, daemon=True)
        thread.start()
        wait_for(lambda: w.held("noisy") == 1, what="the noisy call to run")
        quiet: list[int] = []
        waiter = threading.Thread(target=lambda: quiet.append(
            w.call(os.getpid, tenant="quiet")), daemon=True)
        waiter.start()
        # Queued behind the noisy call (unless a slow machine let its 1 s run out first).
        wait_for(lambda: w.waiting == 1 or bool(outcome), what="the quiet call to wait")
        thread.join(HANG_GUARD_S)
        waiter.join(HANG_GUARD_S)
        assert isinstance(outcome[0], SimTimeout)
        # The killed process was replaced: the quiet call ran, in a new one.
        assert quiet and quiet[0] != os.getpid()
        assert w.waiting == 0 and w.held("noisy") == w.held("quiet") == 0


def _forever() -> None:
    import time
    while True:
        time.sleep(1)


def test_the_adapters_wait_as_the_tenant_they_were_built_for(tmp_path: pathlib.Path
                                                               ) -> None:
    """With two processes, one of them each at once: a tenant holding one is busy at
    once (queue limit 0) though the other is free, so each adapter's call is that
    tenant's, not the default's."""
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    config = TINY.engine_config().to_dict()
    with SimWorker(workers=2, per_tenant=1) as w:
        a = Held(w, tmp_path, tenant="ns-a")
        with pytest.raises(SimulatorBusy, match="'ns-a' holds 1"):
            WorkerTwin(w, tenant="ns-a", queue_timeout_s=0).p99s(
                TINY, config, 1, 5.0, seed=0, bucketed=False, factors=DEFAULT_FACTORS)
        with pytest.raises(SimulatorBusy, match="'ns-a' holds 1"):
            WorkerOffline(w, SimOffline(space, n_trials=2, duration_s=5.0), tenant="ns-a",
                          queue_timeout_s=0).best_configs(TINY, 1, config, 1)
        with pytest.raises(SimulatorBusy, match="'ns-a' holds 1"):
            WorkerPlanner(w, duration_s=5.0, tenant="ns-a",
                          queue_timeout_s=0).search(TINY, config, 1, 2)
        assert w.call(os.getpid, tenant="ns-b", queue_timeout_s=0) != os.getpid()
        assert a.finish() == "done"
    assert WorkerTwin(SimWorker.__new__(SimWorker)).tenant == DEFAULT_TENANT
    with pytest.raises(ValueError, match="per_tenant"):
        SimWorker(workers=2, per_tenant=0)


class Line:
    """Callers of ``turns`` in threads, each taking an item, noting its name, and giving
    the item back at once: with one item the notes are the order they were served."""

    def __init__(self, turns: FairTurns[str]) -> None:
        self.turns, self.order, self.threads = turns, list[str](), list[threading.Thread]()

    def join(self, tenant: str, name: str) -> None:
        def run() -> None:
            item = self.turns.acquire(tenant, None)
            assert item is not None
            self.order.append(name)
            self.turns.release(tenant, item)

        waiting = self.turns.waiting
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        wait_for(lambda: self.turns.waiting == waiting + 1, what=f"{name} to wait")

    def done(self) -> list[str]:
        for thread in self.threads:
            thread.join(HANG_GUARD_S)
        return self.order


def test_freed_items_go_round_the_waiting_tenants_first_come_first_served_in_each() -> None:
    turns = FairTurns(["p"])
    held = turns.acquire("a", None)
    line = Line(turns)
    for i in range(1, 6):
        line.join("a", f"a{i}")
    line.join("b", "b1")
    line.join("b", "b2")
    line.join("c", "c1")
    assert held is not None
    turns.release("a", held)
    # a was served last (its running call), b and c never: b, c, then by turn.
    assert line.done() == ["b1", "c1", "a1", "b2", "a2", "a3", "a4", "a5"]
    assert turns.waiting == 0 and turns.held("a") == 0


def test_a_tenant_at_its_cap_waits_while_another_takes_the_free_item() -> None:
    turns = FairTurns(["p", "q"], per_tenant=1)
    first = turns.acquire("a", None)
    assert first is not None
    assert turns.acquire("a", 0) is None  # one free, but a holds its one
    line = Line(turns)
    line.join("a", "a2")  # waits though an item is free
    assert turns.acquire("b", 0) is not None  # b is under its cap: the free one, now
    assert turns.held("b") == 1 and turns.waiting == 1
    turns.release("a", first)
    assert line.done() == ["a2"]


def test_a_waiter_that_gives_up_leaves_the_line_and_the_turn_as_they_were() -> None:
    turns = FairTurns(["p"])
    held = turns.acquire("a", None)
    line = Line(turns)
    line.join("b", "b1")
    assert turns.acquire("b", 0) is None  # behind b1: gives up at once, b1 stays
    assert turns.acquire("c", 0) is None  # c's line made and removed again
    line.join("c", "c1")
    assert turns.waiting == 2
    assert held is not None
    turns.release("a", held)
    assert line.done() == ["b1", "c1"]
    with pytest.raises(ValueError, match="'a' holds no item"):
        turns.release("a", "p")
    with pytest.raises(ValueError, match="per_tenant=0"):
        FairTurns(["p"], per_tenant=0)
    with pytest.raises(ValueError, match="items"):
        FairTurns([])
