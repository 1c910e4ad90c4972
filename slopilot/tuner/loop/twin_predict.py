"""The twin's P99s over one window: the simulation the twin check holds against the plant.

Apart from ``twin_check.py`` so that it can run where every other simulator call runs
(``sim/worker.py``'s processes, through ``ports.TwinSimulator``): pure-Python simulation
in the controller's process shares the GIL with kopf's event loop, which then ran at 15-18 %
of its pace, gaps up to 164 ms, for as long as the window took, a length the measured
workload sets (0.9 s for 4 requests a second on 2 replicas, 14 s for 64 on 16, per 120 s
window: ``benchmarks/twin_check_stall.py``). ``InProcessTwin`` is for the simulated
world and the tests, whose controller has no event loop to starve.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.alert_factors import AlertFactors
from slopilot.engine.histogram_quantiles import latency_quantile
from slopilot.engine.latency_buckets import token_latency_buckets
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.window_summary import or_none


@dataclass(frozen=True, slots=True)
class ClassP99:
    """One class's TTFT and TBT P99 in the twin's window (None: nothing to read)."""

    priority: Priority
    ttft_ms: float | None
    tbt_ms: float | None


def predicted_p99s(twin: Scenario, config: Mapping[str, Any], replicas: int,
                   window_s: float, *, seed: int, bucketed: bool,
                   factors: AlertFactors) -> tuple[ClassP99, ...]:
    """``twin`` at ``config`` on ``replicas`` for ``window_s``: each class's P99s.

    ``bucketed``: the measured P99s are a histogram's, which reads high inside a bucket
    (23-29 % for TBT in docs/benchmarks.md, TBT truth), so the twin's are read through
    the same buckets; its exact ones against them read as optimism, and a scale-down took
    that much more headroom. Those buckets are the pods': the SLO's thresholds at
    ``factors`` (the deployment's ``spec.alerts``, its pods' ``alerts.json``) are edges
    of them, as the engine and the meter make them (``token_latency_buckets``), so a P99
    near a CR's own alert threshold reads on the side of it the pods' does.
    """
    run = simulate(twin, config, replicas=replicas, duration_s=window_s, seed=seed)
    ttft_edges, tbt_edges = (token_latency_buckets(twin.slo, ttft=t, factors=factors)
                             for t in (True, False))
    out = []
    for p in Priority:
        c = run.summary.classes[p]
        ttft, tbt = c.ttft_p99_ms, c.tbt_p99_ms
        if bucketed:
            s = run.stats.classes[p]
            ttft = or_none(latency_quantile(0.99, s.ttft, never=s.refused,
                                            edges=ttft_edges) * 1000.0)
            tbt = or_none(latency_quantile(0.99, s.tbt, edges=tbt_edges) * 1000.0)
        out.append(ClassP99(p, ttft, tbt))
    return tuple(out)


class InProcessTwin:
    """``ports.TwinSimulator`` in the caller's process: the simulated world, the tests."""

    def p99s(self, twin: Scenario, config: Mapping[str, Any], replicas: int,
             window_s: float, *, seed: int, bucketed: bool,
             factors: AlertFactors) -> tuple[ClassP99, ...]:
        return predicted_p99s(twin, config, replicas, window_s, seed=seed,
                              bucketed=bucketed, factors=factors)
