"""Has the machine moved since calibration? A profile's executor times, checked again.

On a shared machine the same shapes take 10 % more or less an hour later (a
neighbour's memory traffic, clock frequency, the host's other tenants), and a profile
fitted then predicts every shape off by about that much, whatever its form.
``drift_check`` times part of the calibration grid again through the same harness and
compares each shape with the profile's prediction: a form error moves some shapes, a
drift moves them all the same way, so the median signed error reads the drift.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from slopilot.engine.calibrate.design import GridOptions, ShapeSpec, design
from slopilot.engine.calibrate.harness import Harness, TimedExecutor
from slopilot.engine.sim.calibrated import CalibratedCostModel
from slopilot.engine.sim.profile_file import CostProfile

DRIFT_KINDS = ("decode", "prefill", "mixed")


@dataclass(frozen=True)
class DriftCheck:
    shapes: int
    median_error: float
    """Median of (predicted - measured) / measured: below 0 the machine is slower now
    than when the profile was fitted."""
    mape: float


def drift_shapes(grid: GridOptions) -> list[ShapeSpec]:
    """Every other shape of the quick grid's forward passes (no swaps: a copy's time
    moves with other things than a forward pass's)."""
    quick = dataclasses.replace(grid, quick=True, swap=False)
    return [s for s in design(quick) if s.kind in DRIFT_KINDS][::2]


def calibrated_grid(profile: CostProfile) -> GridOptions:
    """The grid ``slopilot calibrate`` timed for ``profile`` (its recorded budget, batch
    and context; the defaults where an older profile recorded none)."""
    fit, default = profile.fit, GridOptions()
    return GridOptions(token_budget=(fit and fit.token_budget) or default.token_budget,
                       max_num_seqs=(fit and fit.max_num_seqs) or default.max_num_seqs,
                       max_context=(fit and fit.max_context) or default.max_context)


def drift_check(executor: TimedExecutor, cost: CalibratedCostModel,
                grid: GridOptions | None = None, *, repeats: int = 5,
                seed: int = 0) -> DriftCheck:
    """Time ``drift_shapes(grid)`` (median of ``repeats`` rounds) against ``cost``; the
    grid defaults to the one ``cost``'s profile was calibrated on."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: expected at least 1")
    grid = grid or calibrated_grid(cost.profile)
    samples = Harness(executor, drift_shapes(grid), max_context=grid.max_context,
                      repeats=repeats, seed=seed).run()
    knee, graphs = cost.decode_knee_tokens, cost.graph_batch
    errors = [(cost.executor_time(s.spec.shape_at(knee, graphs)) - s.seconds) / s.seconds
              for s in samples]
    return DriftCheck(len(errors), statistics.median(errors),
                      statistics.fmean(abs(e) for e in errors))
