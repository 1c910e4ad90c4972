"""A steady low load (0.3 req/s, 40 % P0 of long prompts on tiny-cpu's A100) served by
the production Controller over a SimCluster, ticked on an injected clock as
``benchmarks/closed_loop.py`` runs it: the loop's verdicts rest on a few requests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks.low_traffic_verdicts import scenario
from slopilot.engine.sim.cluster import SimCluster
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Decision
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.adapters import SimAlerts, SimDeployment, SimOffline, SimProbe, SimWindows
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner

TICK_S = 15.0
ONE_REPLICA_P99_MS = 289.0
"""P0 TTFT P99 of one replica of the start config at 0.3 req/s (two 400-min runs, seeds
4242 and 5: 289 and 290 ms); two replicas read ~252 ms."""


@dataclass
class Run:
    cluster: SimCluster
    controller: Controller


def run(rate: float, p0_ttft_ms: float, minutes: float, seed: int, *, replicas: int = 1,
        **settings: Any) -> tuple[Run, Iterator[tuple[float, Decision]]]:
    """The loop at operator defaults (but for ``settings``); yields each tick's decision."""
    sc = scenario(rate, minutes, p0_ttft_ms)
    cluster = SimCluster(sc, dict(sc.engine), replicas=replicas, seed=seed)
    space = SearchSpace.from_bounds(base=sc.engine_config())
    st = ControllerSettings(deployment="low", slo=sc.slo, max_replicas=4, **settings)
    ctl = Controller(st, SimDeployment(cluster), SimAlerts(cluster, RuleOptions()),
                     SimWindows(cluster, min_requests=10),
                     Tuner(open_study(None, "live", seed=seed), space),
                     SimProbe(cluster, window_s=120), CapacityPlanner(seed=seed),
                     offline=SimOffline(space, seed=seed))

    def ticks() -> Iterator[tuple[float, Decision]]:
        t = 0.0
        while t < sc.duration_s:
            t += TICK_S
            cluster.advance(t)
            yield t, ctl.tick(t)
    return Run(cluster, ctl), ticks()
