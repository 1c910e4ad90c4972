"""The simulator work the controller hands to a worker process, and its warm-start ranking."""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.loop.capacity import CapacityError, CapacityPlanner
from slopilot.tuner.sim.adapters import SimOffline, rank_for_warm_start
from slopilot.tuner.sim.worker import SimWorker, WorkerOffline, WorkerPlanner
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace

TINY = load_scenario("tiny-cpu")


def result(name: str, goodput: float, *constraints: float) -> TrialResult:
    return TrialResult({"name": name}, goodput, constraints,
                       feasible=all(c <= 0 for c in constraints))


def test_warm_start_ranks_headroom_before_goodput_on_the_edge() -> None:
    edge = result("edge", 900.0, -0.01, -0.3)  # holds, 1 % under one limit
    roomy = result("roomy", 700.0, -0.25, -0.4)  # holds with 25 % to spare
    close = result("close", 950.0, 0.05, -0.5)  # misses by 5 %
    far = result("far", 990.0, 0.9, -0.5)
    ranked = rank_for_warm_start([far, edge, close, roomy], margin=0.2)
    assert [r.config["name"] for r in ranked] == ["roomy", "edge", "close", "far"]
    # Without a margin the best goodput that holds comes first.
    ranked = rank_for_warm_start([far, edge, close, roomy], margin=0.0)
    assert [r.config["name"] for r in ranked] == ["edge", "roomy", "close", "far"]


@pytest.mark.parametrize("margin", [-0.1, 1.0])
def test_a_bad_margin_is_refused(margin: float) -> None:
    with pytest.raises(ValueError, match="margin"):
        SimOffline(SearchSpace.from_bounds(base=TINY.engine_config()), margin=margin)


def test_a_running_config_outside_the_space_is_no_warm_start_and_no_error() -> None:
    # The space is `slopilot tune`'s; a deployment may run outside it (a wide budget, a
    # preemption cap of 0) and its offline study must still run, just without that start.
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    start = {**TINY.engine_config().to_dict(), "token_budget": 16384,
             "max_preemptions_per_step": 0}
    ranked = SimOffline(space, n_trials=2, duration_s=5.0).best_configs(TINY, 1, start, 2)
    assert ranked and all(space.validate(c) for c, _ in ranked)


def test_scenarios_and_spaces_cross_the_process_boundary_intact() -> None:
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    back = pickle.loads(pickle.dumps((TINY, space)))
    assert back == (TINY, space)
    with pytest.raises(TypeError):  # still read-only on the far side
        back[0].engine["token_budget"] = 1


@pytest.fixture(scope="module")
def worker() -> Iterator[SimWorker]:
    with SimWorker() as w:
        yield w


def test_the_worker_answers_as_the_in_process_search_does(worker: SimWorker) -> None:
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    here = SimOffline(space, n_trials=3, duration_s=5.0, seed=1)
    there = WorkerOffline(worker, SimOffline(space, n_trials=3, duration_s=5.0, seed=1))
    config = TINY.engine_config().to_dict()
    assert there.best_configs(TINY, 1, config, 2) == here.best_configs(TINY, 1, config, 2)
    local = CapacityPlanner(duration_s=5.0, seed=1).search(TINY, config, 1, 3)
    remote = WorkerPlanner(worker, duration_s=5.0, seed=1).search(TINY, config, 1, 3)
    assert remote.replicas == local.replicas
    assert {n: r.feasible for n, r in remote.results.items()} == \
        {n: r.feasible for n, r in local.results.items()}


def test_bad_planner_settings_fail_in_the_caller_not_in_the_worker(worker: SimWorker) -> None:
    with pytest.raises(CapacityError, match="duration_s"):
        WorkerPlanner(worker, duration_s=0)
    with pytest.raises(CapacityError, match="replica bounds"):  # raised there, seen here
        WorkerPlanner(worker, duration_s=5.0).search(TINY, {}, 3, 1)
    with pytest.raises(ValueError, match="workers"):
        SimWorker(workers=0)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_worker_fails_its_call_and_the_next_call_gets_a_new_one() -> None:
    with SimWorker() as w:
        with pytest.raises(BrokenProcessPool):
            w.call(_die)
        assert w.call(os.getpid) != os.getpid()


def _forever() -> None:
    import time
    while True:
        time.sleep(1)


def _hog(mb: int) -> int:
    return len(bytearray(mb * 1024 * 1024))


def test_a_call_past_its_time_is_killed_and_the_next_call_gets_a_new_worker() -> None:
    from slopilot.tuner.sim.worker import SimTimeout

    with SimWorker() as w:
        first = w.call(os.getpid)
        with pytest.raises(SimTimeout, match="1 s"):
            w.call(_forever, timeout_s=1.0)
        assert w.call(os.getpid) != first


def test_a_call_that_would_take_more_memory_than_allowed_fails_alone() -> None:
    with SimWorker(memory_limit_mb=512) as w:
        with pytest.raises(MemoryError):
            w.call(_hog, 1024)
        assert w.call(_hog, 16) == 16 * 1024 * 1024  # the worker lives on


def test_the_planner_and_the_study_calls_carry_their_time_limits() -> None:
    planner = WorkerPlanner(SimWorker.__new__(SimWorker))
    assert planner.timeout_s > 0
    with pytest.raises(ValueError, match="timeout_s"):
        WorkerPlanner(SimWorker.__new__(SimWorker), timeout_s=0)
    with pytest.raises(ValueError, match="memory_limit_mb"):
        SimWorker(memory_limit_mb=10)
