"""The two questions the loop asks the simulator (the twin), in one place.

``warm_starts``: which configs an offline study on the measured workload ranks best at a
replica count (each with "holds in simulation"); ``capacity``: how many replicas hold the
SLO at that load. The steps lean on both with margins (``LoopContext.scale_up_margin``,
``headroom_margin``). Checking the twin against a measured window before its answer is
trusted, and falling back to live trials when it is off, belongs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.loop.capacity import CapacityAnswer
from slopilot.tuner.loop.context import LoopContext

Ranked = list[tuple[dict[str, Any], bool]]


def warm_starts(ctx: LoopContext, now: float, replicas: int, current: Mapping[str, Any],
                scenario: Scenario | None = None) -> Ranked:
    """The offline study's best configs, minus ``current``, the one that is running.

    The running config is what the firing alert measured: the live evidence that it
    does not hold outranks a simulator that says it does (a workload profile that
    lags the shift, a cost model off for this hardware), so it is no warm start.
    """
    current = dict(current)
    scenario = scenario if scenario is not None else ctx.probe.measure(now)
    k = ctx.settings.warm_start_k
    ranked = ctx.offline.best_configs(scenario, replicas, current, k + 1) \
        if ctx.offline is not None else []
    return [(c, ok) for c, ok in ranked
            if any(current.get(key) != v for key, v in c.items())][:k]


def capacity(ctx: LoopContext, scenario: Scenario, config: Mapping[str, Any], lo: int,
             hi: int, *, margin: float) -> CapacityAnswer:
    """The fewest replicas in [lo, hi] that hold the SLO with ``margin`` to spare."""
    return ctx.planner.search(scenario, config, lo, hi, margin=margin)
