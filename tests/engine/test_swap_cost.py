"""The swap-out cost the scheduler judges ``swap_timeout_ms`` by: the executor's guess
until it has timed a swap, then what its swaps measured; and the seconds exported."""

from __future__ import annotations

import pytest

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.swap_cost import SwapCost, SwapCostError
from tests.engine.helpers import make_request
from tests.engine.test_metrics import value
from tests.support.fake_executor import FakeExecutor

# What the torch executor guesses on CPU for SmolLM2-135M's block (737 KB at 10 GB/s).
GUESS_S = 74e-6


class SlowSwaps(FakeExecutor):
    """Reports its swap copies as taking ``per_block_s`` a block, as a timed executor
    whose copies are that slow would."""

    def __init__(self, per_block_s: float) -> None:
        super().__init__(step_s=0.01)
        self.per_block_s = per_block_s

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        result = super().execute(out)
        result.swap_out_s = len(out.swap_out) * self.per_block_s if out.swap_out else None
        result.swap_in_s = len(out.swap_in) * self.per_block_s if out.swap_in else None
        result.elapsed_s += (result.swap_out_s or 0.0) + (result.swap_in_s or 0.0)
        return result


def largest_victim(cost: SwapCost, timeout_ms: float = 50.0) -> int:
    """The most blocks a victim may have and still swap under ``timeout_ms``."""
    return int(timeout_ms / 1000 / cost.per_block_s)


def test_the_guess_stands_until_a_swap_is_timed() -> None:
    cost = SwapCost(GUESS_S)
    assert cost.per_block_s == GUESS_S
    cost.observe_swap_out(4, 0.0)  # no blocks: nothing learned
    cost.observe_swap_out(0, 0.0)
    assert cost.per_block_s == GUESS_S


def test_the_first_timing_moves_the_guess_as_any_swap_would_not_replace_it() -> None:
    # The guess is the average's first entry, a swap the size of the first timed one.
    cost = SwapCost(GUESS_S)
    cost.observe_swap_out(100, 100 * 2 * GUESS_S)  # twice the guess
    assert cost.per_block_s == pytest.approx(GUESS_S * (0.75 + 0.25 * 2))
    faster = SwapCost(GUESS_S)
    faster.observe_swap_out(100, 100 * GUESS_S / 2)
    assert faster.per_block_s == pytest.approx(GUESS_S * (0.75 + 0.25 / 2))


def test_one_cold_swap_does_not_shut_out_large_victims() -> None:
    # SmolLM2-135M on CPU (the review's numbers): the first swap-out into never-touched
    # host pages took 243 ms for 256 blocks (949 us a block, 13x the guess); warm ones
    # 60-144 us. Taken whole, that one swap cut the largest victim allowed under 50 ms
    # from 675 blocks to 52, and eight warm 40-block swaps later it was still 127.
    cost = SwapCost(GUESS_S)
    assert largest_victim(cost) == 675
    cost.observe_swap_out(256, 0.243)
    # Counted as at most 4x the estimate (296 us a block), then averaged with the guess.
    assert cost.per_block_s == pytest.approx(GUESS_S * (0.75 + 0.25 * 4))
    assert largest_victim(cost) >= 380
    for _ in range(8):
        cost.observe_swap_out(40, 40 * 100e-6)  # warm: 100 us a block
    assert cost.per_block_s == pytest.approx(100e-6, rel=0.15)
    assert largest_victim(cost) >= 430


def test_a_spike_among_warm_swaps_counts_as_at_most_four_times_them() -> None:
    cost = SwapCost(GUESS_S)
    for _ in range(20):
        cost.observe_swap_out(64, 64 * 100e-6)
    settled = cost.per_block_s
    cost.observe_swap_out(64, 64 * 5e-3)  # a neighbour's burst: 50x
    assert cost.per_block_s == pytest.approx(settled * (0.75 + 0.25 * 4))
    cost.observe_swap_out(64, 64 * 100e-6)  # the burst was one swap: back to warm
    for _ in range(8):
        cost.observe_swap_out(64, 64 * 100e-6)
    assert cost.per_block_s == pytest.approx(100e-6, rel=0.15)


def test_slow_swaps_in_a_row_are_the_machine_and_believed() -> None:
    # A second swap far above the estimate in a row is no spike: a machine whose copies
    # really are 100x the guess is learned within a few swaps, not a dozen.
    cost = SwapCost(GUESS_S)
    slow = 100 * GUESS_S
    cost.observe_swap_out(8, 8 * slow)
    assert cost.per_block_s < 2 * GUESS_S  # the first alone: perhaps a spike
    cost.observe_swap_out(8, 8 * slow)
    assert cost.per_block_s > 20 * GUESS_S
    for _ in range(6):
        cost.observe_swap_out(8, 8 * slow)
    assert cost.per_block_s == pytest.approx(slow, rel=0.2)


def test_refused_swaps_let_the_guess_back_in() -> None:
    # A burst of slow swaps, believed, then every victim refused: no swap is timed, so
    # nothing could bring the estimate back down once the burst is over. After eight
    # refusals in a row each further one counts as that victim swapped at the guess.
    cost = SwapCost(GUESS_S)
    for _ in range(14):
        cost.observe_swap_out(40, 40 * 10e-3)  # 10 ms a block: no 5-block victim fits
    high = cost.per_block_s
    assert high == pytest.approx(10e-3, rel=0.05)
    for _ in range(8):
        cost.observe_refusal(40)
    assert cost.per_block_s == high  # a few refusals: the estimate may well be right
    refusals = 8
    while largest_victim(cost) < 40:
        cost.observe_refusal(40)
        refusals += 1
        assert refusals < 40, cost.per_block_s
    # A swap timed again restarts the count: refusals after it change nothing at first.
    cost.observe_swap_out(40, 40 * 10e-3)
    before = cost.per_block_s
    for _ in range(8):
        cost.observe_refusal(40)
    assert cost.per_block_s == before


def test_refusals_never_raise_the_estimate_toward_the_guess() -> None:
    cost = SwapCost(GUESS_S)
    for _ in range(20):
        cost.observe_swap_out(40, 40 * GUESS_S / 4)  # faster than the guess
    low = cost.per_block_s
    for _ in range(30):
        cost.observe_refusal(40)  # victims too large even so: nothing to unlearn
    assert cost.per_block_s == low


def test_later_swaps_move_the_estimate_by_their_blocks() -> None:
    cost = SwapCost(GUESS_S, weight=0.5)
    for _ in range(60):
        cost.observe_swap_out(100, 0.1)  # 1 ms a block, settled
    cost.observe_swap_out(1, 0.002)  # 2 ms for one block: its fixed cost weighs little
    # Seconds and blocks averaged apart: (0.05 + 0.001) / (50 + 0.5).
    assert cost.per_block_s == pytest.approx(0.051 / 50.5)
    for _ in range(60):
        cost.observe_swap_out(100, 0.05)
    assert cost.per_block_s == pytest.approx(0.0005)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prior_s_per_block": -1.0}, r"prior_s_per_block=-1\.0"),
    ({"prior_s_per_block": float("nan")}, r"prior_s_per_block=nan"),
    ({"prior_s_per_block": 0.0, "weight": 0.0}, r"weight=0\.0: .*\(0, 1\]"),
    ({"prior_s_per_block": 0.0, "weight": 1.5}, r"weight=1\.5"),
])
def test_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(SwapCostError, match=message):
        SwapCost(**kwargs)


def _engine(executor: FakeExecutor, metrics: EngineMetrics | None = None) -> LLMEngine:
    cfg = EngineConfig().with_overrides({
        "budget_align": 1, "kv_watermark": 0.0, "preemption_mode": "swap",
        "swap_timeout_ms": 50})
    observers = [MetricsObserver(metrics)] if metrics is not None else []
    return LLMEngine(cfg, executor, 8, 32, GUESS_S, clock=VirtualClock(),
                     observers=observers)  # type: ignore[arg-type]


def _run(engine: LLMEngine) -> list[PreemptionMode]:
    """Three requests that outgrow 8 blocks of 16 tokens; each preemption's mode."""
    for i in range(3):
        engine.add_request(make_request(f"r{i}", 20, max_tokens=60, first_token=1000 * i))
    sched = engine.scheduler
    modes: list[PreemptionMode] = []
    seen = dict(sched.num_preemptions)
    while engine.has_work():
        engine.step()
        for mode, n in sched.num_preemptions.items():
            modes += [mode] * (n - seen[mode])
        seen = dict(sched.num_preemptions)
    sched.check_integrity()
    return modes


def test_measured_slow_swaps_turn_the_next_victims_to_recompute() -> None:
    # A victim of 2-5 blocks is under 0.4 ms by the guess, 50 ms a block by the copies.
    slow = _run(_engine(SlowSwaps(per_block_s=0.05)))
    # The guess let the first through, and one slow swap may be a spike; the second
    # slow one in a row is believed, and within a few swaps the victims recompute.
    assert slow[:2] == [PreemptionMode.SWAP] * 2
    assert slow.count(PreemptionMode.SWAP) <= 4
    turned = slow.index(PreemptionMode.RECOMPUTE)
    assert set(slow[turned:]) == {PreemptionMode.RECOMPUTE}
    # Copies as fast as the guess keep swapping: the victims are the same.
    fast = _run(_engine(SlowSwaps(per_block_s=GUESS_S)))
    assert len(fast) > 1 and set(fast) == {PreemptionMode.SWAP}


class BurstThenQuiet(SlowSwaps):
    """Swap-outs at ``per_block_s`` while a neighbour's burst lasts (its first ``slow``
    swap-outs), then at the guess."""

    def __init__(self, per_block_s: float, slow: int) -> None:
        super().__init__(per_block_s)
        self.slow = slow

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if out.swap_out:
            if self.slow == 0:
                self.per_block_s = GUESS_S
            self.slow -= 1
        return super().execute(out)


def test_swaps_resume_after_a_burst_that_refused_them_all() -> None:
    # Three swaps at 100 ms a block (a burst on a shared machine) and every victim is
    # over 50 ms by them. No swap, no timing: the estimate stayed at the burst's for good,
    # and every preemption after it threw its victim's KV away. Refusals let the guess
    # back in, a victim fits again, its copy is timed fast, and swapping resumes.
    engine = _engine(BurstThenQuiet(per_block_s=0.1, slow=3))
    for i in range(3, 12):
        engine.add_request(make_request(f"r{i}", 20, max_tokens=60, first_token=1000 * i))
    modes = _run(engine)
    turned = modes.index(PreemptionMode.RECOMPUTE)  # the burst's swaps believed
    assert PreemptionMode.SWAP in modes[turned:], modes
    assert engine.scheduler.swap_s_per_block < 10 * GUESS_S


def test_swap_seconds_exported_are_what_the_executor_measured() -> None:
    metrics = EngineMetrics("tiny", clock=lambda: 0.0)
    executor = SlowSwaps(per_block_s=0.05)
    _run(_engine(executor, metrics))
    copied = sum(len(out.swap_out) + len(out.swap_in) for out in executor.calls)
    assert copied > 0
    # Not the blocks times the guess (3 ms here): the 50 ms a block the copies took.
    assert value(metrics, "slopilot_swap_seconds_total") == pytest.approx(copied * 0.05)


def test_an_executor_that_times_nothing_leaves_the_guess() -> None:
    engine = _engine(FakeExecutor())
    modes = _run(engine)
    assert PreemptionMode.SWAP in modes
    assert engine.scheduler.swap_s_per_block == GUESS_S
