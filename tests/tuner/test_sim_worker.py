"""The simulator work the controller hands to a worker process, and its warm-start ranking."""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool

import pytest

from slopilot.engine.alert_factors import DEFAULT_FACTORS, AlertFactors
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.twin import with_profile
from slopilot.tuner.loop.capacity import CapacityError, CapacityPlanner
from slopilot.tuner.loop.ports import SimulatorBusy, SimulatorFailed
from slopilot.tuner.loop.twin_predict import predicted_p99s
from slopilot.tuner.sim.adapters import SimOffline, rank_for_warm_start
from slopilot.tuner.sim.worker import (
    CHECK_QUEUE_TIMEOUT_S,
    QUEUE_TIMEOUT_S,
    SimTimeout,
    SimWorker,
    WorkerOffline,
    WorkerPlanner,
    WorkerTwin,
)
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace
from tests.support.held_calls import Held
from tests.support.profiles import make_profile
from tests.support.waits import HANG_GUARD_S, wait_for

TINY = load_scenario("tiny-cpu")
FLOORLESS = 0
"""No floor of requests per class: a study's or plan's runs stay the 5 s the test asks
for, not the ~20 min of virtual time the 200-request floor stretches tiny-cpu's to
(12 s of CPU per study; past the 300 s test limit on a loaded 2-core runner). What
these tests check (the warm start's fallback, the worker's answers) is not the floor's."""


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


@pytest.mark.parametrize("floor", [-1, True])
def test_a_bad_request_floor_is_refused_naming_it(floor: object) -> None:
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    with pytest.raises(ValueError, match=r"min_class_requests=.*count >= 0"):
        SimOffline(space, min_class_requests=floor)  # type: ignore[arg-type]
    with pytest.raises(CapacityError, match=r"min_class_requests=.*count >= 0"):
        WorkerPlanner(None, min_class_requests=floor)  # type: ignore[arg-type]


def test_the_study_runs_as_long_as_its_floor_asks() -> None:
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    config = TINY.engine_config().to_dict()
    # tiny-cpu's 5 s hold ~15 requests: the default floor stretches them, none does not.
    assert SimOffline(space, duration_s=5.0)._duration(TINY, 1, config) > 60.0
    assert SimOffline(space, duration_s=5.0, min_class_requests=FLOORLESS)._duration(
        TINY, 1, config) == 5.0


def test_a_running_config_outside_the_space_is_no_warm_start_and_no_error() -> None:
    # The space is `slopilot tune`'s; a deployment may run outside it (a wide budget, a
    # preemption cap of 0) and its offline study must still run, just without that start.
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    start = {**TINY.engine_config().to_dict(), "token_budget": 16384,
             "max_preemptions_per_step": 0}
    # One trial: were the start enqueued anyway, it would be that trial and fail validate.
    ranked = SimOffline(space, n_trials=1, duration_s=5.0,
                        min_class_requests=FLOORLESS).best_configs(TINY, 1, start, 2)
    assert len(ranked) == 1 and all(space.validate(c) for c, _ in ranked)


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
    # Two trials: the warm start and one sampled, so the ranking is of two configs.
    here = SimOffline(space, n_trials=2, duration_s=5.0, seed=1, min_class_requests=FLOORLESS)
    there = WorkerOffline(worker, SimOffline(space, n_trials=2, duration_s=5.0, seed=1,
                                             min_class_requests=FLOORLESS))
    config = TINY.engine_config().to_dict()
    assert there.best_configs(TINY, 1, config, 2) == here.best_configs(TINY, 1, config, 2)
    local = CapacityPlanner(duration_s=5.0, seed=1, min_class_requests=FLOORLESS).search(
        TINY, config, 1, 3)
    remote = WorkerPlanner(worker, duration_s=5.0, seed=1,
                           min_class_requests=FLOORLESS).search(TINY, config, 1, 3)
    assert remote.replicas == local.replicas
    assert {n: r.feasible for n, r in remote.results.items()} == \
        {n: r.feasible for n, r in local.results.items()}


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("profiled", [False, True])
def test_the_twin_checks_window_is_simulated_in_the_worker_as_here(
        worker: SimWorker, bucketed: bool, profiled: bool) -> None:
    # The check sends the twin on its corrected profile (read-only maps inside), and the
    # CR's alert factors its pods' edges are made of.
    twin = with_profile(TINY, make_profile()) if profiled else TINY
    config = TINY.engine_config().to_dict()
    factors = AlertFactors(ttft_retune=1.37, tbt_scale=1.5)
    here = predicted_p99s(twin, config, 2, 5.0, seed=3, bucketed=bucketed, factors=factors)
    there = WorkerTwin(worker).p99s(twin, config, 2, 5.0, seed=3, bucketed=bucketed,
                                    factors=factors)
    assert there == here and [c.priority for c in there] == list(Priority)
    assert any(c.tbt_ms is not None for c in there)


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
        # The loop's own error (ports.NO_ANSWER), not the pool's: no answer from the twin.
        with pytest.raises(SimulatorFailed, match="died during the call") as info:
            w.call(_die)
        assert isinstance(info.value.__cause__, BrokenProcessPool)
        assert w.call(os.getpid) != os.getpid()


def _reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_worker_killed_while_idle_is_replaced_at_the_next_call() -> None:
    # The kernel's OOM killer picks the largest process of a pod under memory pressure, an
    # idle simulator worker too; the pool then breaks between calls, and every later
    # call of every deployment failed at submit, the broken pool never replaced.
    with SimWorker() as w:
        pid = w.call(os.getpid)
        os.kill(pid, signal.SIGKILL)
        # Reaped by the pool's manager thread, which marks the pool broken first.
        wait_for(lambda: _reaped(pid), f"worker {pid} reaped by its pool")
        fresh = w.call(os.getpid)  # nothing ran on the dead one: a new process runs it
        assert fresh != pid and fresh != os.getpid()


def _forever() -> None:
    import time
    while True:
        time.sleep(1)


def _hog(mb: int) -> int:
    return len(bytearray(mb * 1024 * 1024))


def test_a_call_past_its_time_is_killed_and_the_next_call_gets_a_new_worker() -> None:
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


def test_a_call_behind_another_deployments_is_not_timed_while_it_waits(
        tmp_path: pathlib.Path) -> None:
    """concurrent.futures marks a call running when it joins the worker's call queue,
    behind the call in progress: its time limit ran out there, and its timeout killed the
    process serving the other deployment's call. A call now waits for a free process
    untimed, and its limit counts from when it runs."""
    with SimWorker() as w:
        a = Held(w, tmp_path)
        behind: list[object] = []
        thread = threading.Thread(target=lambda: behind.append(
            w.call(os.getpid, timeout_s=1.0)), daemon=True)
        thread.start()
        wait_for(lambda: w.waiting == 1, what="the second call to wait for a process")
        since = time.monotonic()
        # Three times its limit behind the first call (a slow machine only waits longer).
        wait_for(lambda: time.monotonic() - since > 3.0, what="three seconds to pass")
        assert w.waiting == 1 and not behind
        assert a.finish() == "done"
        thread.join(HANG_GUARD_S)
        assert isinstance(behind[0], int)


def test_a_call_that_finds_no_free_process_in_time_is_busy_and_harms_nothing(
        tmp_path: pathlib.Path) -> None:
    with SimWorker() as w:
        a = Held(w, tmp_path)
        with pytest.raises(SimulatorBusy, match="1 simulator process"):
            w.call(os.getpid, queue_timeout_s=0)
        assert w.waiting == 0
        assert a.finish() == "done"
        with pytest.raises(ValueError, match="queue_timeout_s"):
            w.call(os.getpid, queue_timeout_s=-1)


def test_a_twin_window_behind_another_deployments_call_is_busy_within_its_limit(
        tmp_path: pathlib.Path) -> None:
    with SimWorker() as w:
        a = Held(w, tmp_path)
        with pytest.raises(SimulatorBusy, match="1 simulator process"):
            WorkerTwin(w, queue_timeout_s=0).p99s(TINY, {}, 1, 5.0, seed=0, bucketed=False,
                                                  factors=DEFAULT_FACTORS)
        assert a.finish() == "done"
    with pytest.raises(ValueError, match="timeout_s"):
        WorkerTwin(SimWorker.__new__(SimWorker), timeout_s=0)
    # A report, unless a latency bound asks for it: it does not wait as long as the warm
    # start after it in the same tick does (that doubled the tick's wait).
    assert WorkerTwin(SimWorker.__new__(SimWorker)).queue_timeout_s == CHECK_QUEUE_TIMEOUT_S
    assert CHECK_QUEUE_TIMEOUT_S < QUEUE_TIMEOUT_S / 10


def test_processes_are_apart_a_timeout_kills_only_its_own_call(tmp_path: pathlib.Path
                                                               ) -> None:
    with SimWorker(workers=2) as w:
        a = Held(w, tmp_path)
        with pytest.raises(SimTimeout):
            w.call(_forever, timeout_s=1.0)
        assert a.finish() == "done"  # the other process ran on
        assert w.call(os.getpid) != os.getpid()


def test_the_study_and_the_planner_pass_their_queue_limit(tmp_path: pathlib.Path) -> None:
    space = SearchSpace.from_bounds(base=TINY.engine_config())
    config = TINY.engine_config().to_dict()
    with SimWorker() as w:
        a = Held(w, tmp_path)
        with pytest.raises(SimulatorBusy):
            WorkerOffline(w, SimOffline(space, n_trials=2, duration_s=5.0),
                          queue_timeout_s=0).best_configs(TINY, 1, config, 1)
        with pytest.raises(SimulatorBusy):
            WorkerPlanner(w, duration_s=5.0, queue_timeout_s=0).search(TINY, config, 1, 2)
        a.finish()
    with pytest.raises(ValueError, match="queue_timeout_s"):
        WorkerPlanner(SimWorker.__new__(SimWorker), queue_timeout_s=-1)


def test_a_ctrl_c_at_the_terminal_leaves_the_worker_to_its_parent() -> None:
    """A terminal's Ctrl-C reaches its whole process group: the worker died with a
    KeyboardInterrupt traceback on the demo's stderr and its call failed, where the
    demo meant to finish its report. Its parent stops it (or its death does)."""
    import os
    import signal

    with SimWorker() as worker:
        pid = worker.call(os.getpid)
        os.kill(pid, signal.SIGINT)
        assert worker.call(os.getpid) == pid  # the same process, alive, answering
