"""AsyncEngine without HTTP: streams, aborts, staged configs, drain, idle, failure."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.engine import LLMEngine
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.request import FinishReason, Priority
from slopilot.engine.scheduler import DisplacedError, DuplicateRequestError, QueueFullError
from slopilot.engine.server.async_engine import (
    AsyncEngine,
    DrainedError,
    EngineDeadError,
    TooManyChoicesError,
)
from tests.engine.helpers import make_request
from tests.support.fake_executor import FakeExecutor
from tests.support.waits import HANG_GUARD_S

T = TypeVar("T")


class GatedExecutor(FakeExecutor):
    """Blocks each iteration until the test lets it run (so a request stays live)."""

    def __init__(self) -> None:
        super().__init__(step_s=0.0)
        self.gate = threading.Semaphore(0)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.gate.acquire()
        return super().execute(out)


def _engine(executor: FakeExecutor | None = None, blocks: int = 64, **knobs: object
            ) -> LLMEngine:
    cfg = EngineConfig().with_overrides({"budget_align": 1, **knobs})
    return LLMEngine(cfg, executor or FakeExecutor(step_s=0.0), blocks)


async def test_tokens_stream_in_order_then_finish() -> None:
    engine = AsyncEngine(_engine())
    engine.start()
    stream = await engine.add_request(make_request("a", 10, max_tokens=5))
    tokens: list[int] = []
    finish = None
    async for delta in stream:
        tokens += delta.token_ids
        finish = delta.finish_reason
    assert len(tokens) == 5 and finish is FinishReason.LENGTH
    assert await engine.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
    await engine.shutdown()
    assert not engine.is_running


async def test_abort_frees_blocks_between_iterations() -> None:
    ex = GatedExecutor()
    engine = AsyncEngine(_engine(ex))
    engine.start()
    stream = await engine.add_request(make_request("a", 40, max_tokens=100))
    ex.gate.release()  # the first iteration (prefill) runs
    first = await stream.__anext__()
    assert first.token_ids
    stream.abort()
    ex.gate.release(1000)
    used = await engine.call(lambda e: (e.scheduler.kv.num_used_blocks, len(e.scheduler.requests)))
    assert used == (0, 0)
    await engine.shutdown()


async def test_config_update_is_staged_whole() -> None:
    engine = AsyncEngine(_engine())
    engine.start()
    new = await engine.update_config({"chunk_size": 64, "token_budget": 128})
    assert engine.config == new
    with pytest.raises(ConfigError):
        await engine.update_config({"chunk_size": 64, "block_size": 8})
    assert engine.config == new
    # Staged: the scheduler swaps it in at its next iteration.
    stream = await engine.add_request(make_request("a", 200, max_tokens=1))
    async for _ in stream:
        pass
    assert await engine.call(lambda e: e.scheduler.config) == new
    await engine.shutdown()


async def test_integrity_checks_stay_off_the_serving_path_by_default() -> None:
    engine = AsyncEngine(_engine())
    engine.start()
    stream = await engine.add_request(make_request("a", 5, max_tokens=2))
    async for _ in stream:
        pass
    await engine.call(lambda e: None)
    assert engine.num_idle_checks == 0  # O(KV blocks): seconds on a large cache
    await engine.shutdown()


async def test_idle_loop_checks_integrity_and_does_not_spin() -> None:
    engine = AsyncEngine(_engine(), check_integrity=True)
    engine.start()
    stream = await engine.add_request(make_request("a", 5, max_tokens=2))
    async for _ in stream:
        pass
    await engine.call(lambda e: None)
    checks = engine.num_idle_checks
    steps = engine.engine.num_steps
    for _ in range(5):
        await engine.call(lambda e: None)  # wakes the loop; no work, so no step
    assert engine.engine.num_steps == steps
    assert checks >= 1
    await engine.shutdown()


class SlowExecutor(FakeExecutor):
    """Each step a pretend forward pass of 2 ms: a request of 100,000 tokens outlives any
    drain's timeout the tests give, on however fast a machine."""

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        time.sleep(0.002)
        return super().execute(out)


async def test_drain_timeout_aborts_and_counts() -> None:
    engine = AsyncEngine(_engine(SlowExecutor()))
    engine.start()
    stream = await engine.add_request(make_request("a", 5, max_tokens=100_000))
    aborted = await asyncio.wait_for(engine.drain(0.05), HANG_GUARD_S)
    assert aborted == 1
    deltas = [d async for d in stream]
    assert deltas[-1].finish_reason is FinishReason.ABORT
    assert await engine.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
    await engine.shutdown()


async def test_drain_refuses_the_requests_none_of_whose_choices_started() -> None:
    """Past the drain's timeout, the choices of one HTTP request (admitted together)
    are ended alike: refused (``DrainedError``, a 503) where none had a token, so the
    client retries elsewhere; aborted, as cut short, where one had."""
    engine = AsyncEngine(_engine(SlowExecutor(), max_num_seqs=1, max_waiting=4))
    engine.start()
    started = await engine.add_requests([make_request(f"a{i}", 5, max_tokens=100_000)
                                         for i in range(2)])
    queued = await engine.add_requests([make_request(f"b{i}", 5) for i in range(2)])
    assert (await anext(started[0])).token_ids  # a0 runs; a1, b0 and b1 wait
    assert await asyncio.wait_for(engine.drain(0.05), HANG_GUARD_S) == 4
    for stream in started:
        deltas = [d async for d in stream]
        assert deltas[-1].finish_reason is FinishReason.ABORT
    for stream in queued:
        with pytest.raises(DrainedError, match="draining"):
            await anext(stream)
    assert await engine.call(lambda e: e.scheduler.kv.num_used_blocks) == 0
    await engine.shutdown()


async def test_executor_failure_fails_streams_and_new_requests() -> None:
    class Broken(FakeExecutor):
        def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
            raise RuntimeError("device lost")

    engine = AsyncEngine(_engine(Broken()))
    engine.start()
    stream = await engine.add_request(make_request("a", 5, max_tokens=3))
    with pytest.raises(RuntimeError, match="device lost"):
        async for _ in stream:
            pass
    with pytest.raises(EngineDeadError):
        await engine.add_request(make_request("b", 5))
    await engine.shutdown()


def test_metrics_observer_passes_deltas_of_scheduler_counters() -> None:
    metrics = EngineMetrics("m")
    obs = MetricsObserver(metrics)
    # Tiny cache: four requests that outgrow it force preemptions.
    engine = _engine(blocks=6, max_preemptions_per_step=4, preemption_mode="recompute")
    engine.observers.append(obs)
    for i in range(4):
        engine.add_request(make_request(f"r{i}", 20, max_tokens=20, first_token=10 * i))
    engine.run_until_idle(10_000)
    sched = engine.scheduler
    assert metrics.preempted_recompute == sum(sched.num_preemptions.values()) > 0
    assert metrics.prefix_queries == sched.prefix_queries
    assert metrics.prefix_hits == sched.prefix_hits
    assert metrics.generation_tokens == 4 * 20
    assert sum(metrics._success.values()) == 4
    obs.refresh(engine, engine.clock.now())
    assert metrics.preempted_recompute == sum(sched.num_preemptions.values())
    assert metrics.num_running == 0 and metrics.kv_usage == 0


async def test_a_duplicate_id_leaves_the_live_request_alone() -> None:
    ex = GatedExecutor()
    engine = AsyncEngine(_engine(ex))
    engine.start()
    first = await engine.add_request(make_request("a", 10, max_tokens=3))
    with pytest.raises(DuplicateRequestError, match="already in use"):
        await engine.add_request(make_request("a", 4))
    assert engine.num_active == 1
    ex.gate.release(1000)
    deltas = [d async for d in first]
    assert sum(len(d.token_ids) for d in deltas) == 3
    assert deltas[-1].finish_reason is FinishReason.LENGTH
    assert engine.num_active == 0
    await engine.shutdown()


async def _one_step_then(engine: AsyncEngine, ex: GatedExecutor, work: Awaitable[T]) -> T:
    """Queue ``work``'s command, then let the iteration that holds the thread end."""
    task = asyncio.ensure_future(work)
    while not engine._inbox:  # the command is queued before the task first waits
        await asyncio.sleep(0)
    ex.gate.release(1)
    return await task


async def test_choices_are_admitted_all_or_none() -> None:
    ex = GatedExecutor()
    engine = AsyncEngine(_engine(ex, max_waiting=2, max_num_seqs=1))
    engine.start()
    running = await engine.add_request(make_request("a", 5, max_tokens=100))
    # "a" runs (each iteration held at the gate), "b" waits: one waiting slot is left
    # for two choices.
    await _one_step_then(engine, ex, engine.add_request(
        make_request("b", 5, max_tokens=2, first_token=50)))
    reqs = [make_request(f"c{i}", 5, first_token=100 * (i + 1)) for i in range(2)]
    with pytest.raises(QueueFullError):
        await _one_step_then(engine, ex, engine.add_requests(reqs))
    assert engine.num_active == 2
    assert await _one_step_then(engine, ex, engine.call(
        lambda e: sorted(e.scheduler.requests))) == ["a", "b"]
    ex.gate.release(1000)
    assert [d async for d in running][-1].finish_reason is FinishReason.LENGTH
    await engine.shutdown()


async def test_a_full_queue_displaces_an_unstarted_p2_for_a_p0_and_tells_its_stream(
        ) -> None:
    ex = GatedExecutor()
    engine = AsyncEngine(_engine(ex, max_waiting=1, max_num_seqs=1))
    engine.start()
    running = await engine.add_request(make_request("a", 5, max_tokens=100,
                                                    priority=Priority.P2))
    batch = await _one_step_then(engine, ex, engine.add_request(
        make_request("b", 5, max_tokens=2, first_token=50, priority=Priority.P2)))
    # The queue (max_waiting=1) is full of a P2 that has not started: a P0 takes its place.
    urgent = await _one_step_then(engine, ex, engine.add_request(
        make_request("c", 5, max_tokens=2, first_token=90, priority=Priority.P0)))
    with pytest.raises(DisplacedError, match="gave way to a more urgent p0"):
        await batch.__anext__()
    assert engine.num_active == 2
    # A P2 newcomer displaces nobody: the queue holds a P0 only.
    with pytest.raises(QueueFullError) as refused:
        await _one_step_then(engine, ex, engine.add_request(
            make_request("d", 5, first_token=130, priority=Priority.P2)))
    assert not isinstance(refused.value, DisplacedError)
    ex.gate.release(1000)
    assert [d async for d in urgent][-1].finish_reason is FinishReason.LENGTH
    assert [d async for d in running][-1].finish_reason is FinishReason.LENGTH
    assert await engine.call(lambda e: len(e.scheduler.requests)) == 0
    await engine.shutdown()


async def test_more_choices_than_the_queue_holds_are_refused_for_good() -> None:
    # Retrying never helps: even an empty queue takes at most max_waiting of them.
    engine = AsyncEngine(_engine(max_waiting=2))
    engine.start()
    reqs = [make_request(f"c{i}", 5, first_token=100 * i) for i in range(3)]
    with pytest.raises(TooManyChoicesError, match="max_waiting=2"):
        await engine.add_requests(reqs)
    assert engine.num_active == 0
    assert await engine.call(lambda e: len(e.scheduler.requests)) == 0
    await engine.shutdown()
