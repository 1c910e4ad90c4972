"""The simulated executor: modelled times, placeholder tokens, realtime pacing, sizing,
and a whole engine run on it in virtual time."""

from __future__ import annotations

import pytest

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.executors.base import Executor
from slopilot.engine.executors.simulated import SimulatedExecutor
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import Request, RequestStatus, SamplingParams
from slopilot.engine.sim.cost_model import CostModel, CostModelError
from tests.engine.helpers import make_request


@pytest.fixture(scope="module")
def cost_model() -> CostModel:
    return CostModel("h800", "deepseek-67b", tp=8)


def seq(rid: str, n: int, start: int, sample: bool = True,
        sampling: SamplingParams | None = None) -> ScheduledSeq:
    return ScheduledSeq(rid, list(range(7, 7 + n)), start, block_table=[], sample=sample,
                        sampling=sampling or SamplingParams())


def mixed_batch() -> SchedulerOutput:
    seqs = [seq("prefill-mid", 300, 0, sample=False), seq("prefill-last", 50, 400)]
    seqs += [seq(f"d{i}", 1, 1000 + i) for i in range(5)]
    return SchedulerOutput(seqs=seqs, num_batched_tokens=355)


def test_it_is_an_executor(cost_model: CostModel) -> None:
    assert isinstance(SimulatedExecutor(cost_model), Executor)


def test_elapsed_is_the_cost_model_time_of_the_batch(cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model)
    result = ex.execute(mixed_batch())
    expected = cost_model.iteration_time(
        [(300, 0), (50, 400)] + [(1, 1000 + i) for i in range(5)])
    assert result.elapsed_s == pytest.approx(expected, rel=1e-12)
    assert ex.num_iterations == 1
    assert ex.busy_s == result.elapsed_s


def test_swaps_add_pcie_time_before_the_pass(cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model, block_size=16)
    out = mixed_batch()
    base = ex.execute(out).elapsed_s
    out.swap_out = [(i, i) for i in range(100)]
    out.swap_in = [(i, 200 + i) for i in range(40)]
    result = ex.execute(out)
    assert result.elapsed_s - base == pytest.approx(
        cost_model.swap_time(100, 16) + cost_model.swap_time(40, 16), rel=1e-9)
    # The modelled copies are what it reports it spent on them.
    assert result.swap_out_s == cost_model.swap_time(100, 16)
    assert result.swap_in_s == cost_model.swap_time(40, 16)
    assert (ex.execute(mixed_batch()).swap_out_s, ex.execute(mixed_batch()).swap_in_s) \
        == (None, None)


def test_a_swap_only_iteration_costs_just_the_copies(cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model, block_size=16)
    out = SchedulerOutput(swap_out=[(1, 2), (3, 4)])
    assert ex.execute(out).elapsed_s == pytest.approx(cost_model.swap_time(2, 16))
    assert ex.execute(SchedulerOutput()).elapsed_s == 0.0


def test_only_sampling_rows_get_a_token_and_it_is_the_placeholder(
        cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model, eos_token_id=2, placeholder_token_id=42)
    sampled = ex.execute(mixed_batch()).sampled
    assert set(sampled) == {"prefill-last", *(f"d{i}" for i in range(5))}
    assert set(sampled.values()) == {42}


def test_a_stop_token_equal_to_the_placeholder_is_avoided(cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model, eos_token_id=0, placeholder_token_id=1)
    stops = SamplingParams(stop_token_ids=frozenset({1, 2}))
    sampled = ex.execute(SchedulerOutput(seqs=[seq("r", 1, 10, sampling=stops)])).sampled
    assert sampled["r"] not in (0, 1, 2)


def test_placeholder_equal_to_eos_is_refused(cost_model: CostModel) -> None:
    with pytest.raises(CostModelError, match="placeholder_token_id=5 is the EOS token"):
        SimulatedExecutor(cost_model, eos_token_id=5, placeholder_token_id=5)


def test_placeholder_outside_the_vocabulary_is_refused() -> None:
    tiny = CostModel("a100", "tiny-random")
    with pytest.raises(CostModelError, match=r"placeholder_token_id=300 .* \[0, 256\)"):
        SimulatedExecutor(tiny, placeholder_token_id=300)


def test_a_bad_block_size_fails_at_construction(cost_model: CostModel) -> None:
    with pytest.raises(CostModelError, match="block_size=0"):
        SimulatedExecutor(cost_model, block_size=0)


class FakeTime:
    """A clock that moves only when slept on, or by a fixed cost per reading."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 100.0
        self.tick = tick
        self.sleeps: list[float] = []

    def clock(self) -> float:
        self.now += self.tick
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_realtime_mode_sleeps_the_modelled_time_less_what_it_spent(
        cost_model: CostModel) -> None:
    t = FakeTime(tick=0.0005)  # each clock reading costs 0.5 ms of "work"
    ex = SimulatedExecutor(cost_model, realtime=True, clock=t.clock, sleep=t.sleep)
    result = ex.execute(mixed_batch())
    assert t.sleeps == [pytest.approx(result.elapsed_s - 0.0005)]


def test_virtual_mode_never_sleeps(cost_model: CostModel) -> None:
    t = FakeTime()
    ex = SimulatedExecutor(cost_model, clock=t.clock, sleep=t.sleep)
    ex.execute(mixed_batch())
    assert t.sleeps == []


def test_sizing_helpers_follow_the_cost_model(cost_model: CostModel) -> None:
    ex = SimulatedExecutor(cost_model, block_size=32)
    assert ex.num_gpu_blocks() == cost_model.num_kv_blocks(32, 0.9)
    assert ex.num_gpu_blocks(0.8) == cost_model.num_kv_blocks(32, 0.8)
    assert ex.num_cpu_blocks(8) == cost_model.num_cpu_blocks(32, 8)
    assert ex.swap_time_per_block_s == cost_model.swap_time_per_block(32)
    assert ex.swap_time_per_block_s > SimulatedExecutor(cost_model).swap_time_per_block_s


def test_an_engine_runs_requests_to_max_tokens_in_virtual_time() -> None:
    cm = CostModel("h100", "llama-3-8b")
    ex = SimulatedExecutor(cm, block_size=16, eos_token_id=100, placeholder_token_id=7)
    clock = VirtualClock()
    config = EngineConfig(token_budget=1024, chunk_size=512)
    engine = LLMEngine(config, ex, num_gpu_blocks=ex.num_gpu_blocks(),
                       swap_s_per_block=ex.swap_time_per_block_s, clock=clock)
    reqs: list[Request] = []
    for i, prompt in enumerate((40, 700, 2000)):
        req = make_request(f"r{i}", prompt, max_tokens=6, ignore_eos=False)
        req.eos_token_id = 100
        reqs.append(req)
        engine.add_request(req)
    engine.run_until_idle()
    for req in reqs:
        assert req.status == RequestStatus.FINISHED_LENGTH
        assert req.output_token_ids == [7] * 6
    assert clock.now() == pytest.approx(ex.busy_s)
    # A 2000-token prompt on one H100 takes tens of milliseconds, not seconds.
    assert 0.03 < clock.now() < 1.0

