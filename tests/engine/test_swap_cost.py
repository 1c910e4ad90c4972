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


def test_the_guess_stands_until_a_swap_is_timed() -> None:
    cost = SwapCost(GUESS_S)
    assert cost.per_block_s == GUESS_S
    cost.observe_swap_out(4, 0.0)  # no blocks: nothing learned
    cost.observe_swap_out(0, 0.0)
    assert cost.per_block_s == GUESS_S
    # The first measurement replaces the guess outright: a guess is no evidence.
    cost.observe_swap_out(8, 0.4)
    assert cost.per_block_s == pytest.approx(0.05)


def test_later_swaps_move_the_estimate_by_their_blocks() -> None:
    cost = SwapCost(GUESS_S, weight=0.5)
    cost.observe_swap_out(100, 1.0)  # 10 ms a block
    cost.observe_swap_out(1, 0.001)  # 1 ms for one block: its fixed cost weighs little
    # Seconds and blocks averaged apart: (0.5 + 0.0005) / (50 + 0.5).
    assert cost.per_block_s == pytest.approx(0.5005 / 50.5)
    for _ in range(60):
        cost.observe_swap_out(100, 0.1)
    assert cost.per_block_s == pytest.approx(0.001)


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


def test_a_measured_slow_swap_turns_the_next_victim_to_recompute() -> None:
    # A victim of 2-5 blocks is under 0.4 ms by the guess, 50 ms a block by the copies.
    slow = _run(_engine(SlowSwaps(per_block_s=0.05)))
    assert slow[0] is PreemptionMode.SWAP  # the guess let the first one through...
    assert len(slow) > 1 and set(slow[1:]) == {PreemptionMode.RECOMPUTE}  # ...no more
    # Copies as fast as the guess keep swapping: the victims are the same.
    fast = _run(_engine(SlowSwaps(per_block_s=GUESS_S)))
    assert len(fast) > 1 and set(fast) == {PreemptionMode.SWAP}


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
