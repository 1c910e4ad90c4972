"""A profile re-checked on the machine later: how far its executor times have moved."""

from __future__ import annotations

import pytest

from slopilot.engine.calibrate.design import DesignError, GridOptions
from slopilot.engine.calibrate.drift import drift_check, drift_shapes
from slopilot.engine.sim.calibrated import CalibratedCostModel
from tests.engine.calibrate.synthetic import TRUE, SyntheticExecutor
from tests.support.profiles import make_profile

GRID = GridOptions(token_budget=256, max_num_seqs=16, max_context=512, quick=True)


def _cost() -> CalibratedCostModel:
    return CalibratedCostModel(make_profile("tiny-random", device="cpu", host={},
                                            executor=TRUE, kv_gib=0.01))


@pytest.mark.parametrize("slowdown", [1.0, 1.12, 0.9])
def test_a_machine_slower_or_faster_than_at_calibration_reads_as_drift(
        slowdown: float) -> None:
    executor = SyntheticExecutor({k: v * slowdown for k, v in TRUE.items()})
    check = drift_check(executor, _cost(), GRID, repeats=3)
    assert check.shapes == len(drift_shapes(GRID)) >= 8
    # The profile predicts the calibrated times: the prediction is 1 / slowdown of each.
    assert check.median_error == pytest.approx(1 / slowdown - 1, abs=1e-9)
    assert check.mape == pytest.approx(abs(1 / slowdown - 1), abs=1e-9)
    assert executor.calls > 4 * check.shapes  # a warm-up and three rounds of each


def test_the_shapes_cover_decodes_prefill_and_mixed_batches_but_no_swaps() -> None:
    kinds = {s.kind for s in drift_shapes(GRID)}
    assert kinds == {"decode", "prefill", "mixed"}


def test_bad_options_are_refused() -> None:
    with pytest.raises(DesignError, match="--max-num-seqs 1"):
        drift_shapes(GridOptions(max_num_seqs=1))
    with pytest.raises(ValueError, match="repeats=0: expected at least 1"):
        drift_check(SyntheticExecutor(), _cost(), GRID, repeats=0)
