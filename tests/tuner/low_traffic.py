"""A steady low load (0.3 req/s, 40 % P0 of long prompts on tiny-cpu's A100) served by
the production Controller over a SimCluster, ticked on an injected clock as
``benchmarks/closed_loop.py`` runs it: the loop's verdicts rest on a few requests."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.tuner.loop.capacity import CapacityPlanner
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Decision
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.sim.adapters import SimAlerts, SimDeployment, SimOffline, SimProbe, SimWindows
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from tests.docs.test_doc_references import ROOT

TICK_S = 15.0
ONE_REPLICA_P99_MS = 289.0
"""P0 TTFT P99 of one replica of the start config at 0.3 req/s (two 400-min runs, seeds
4242 and 5: 289 and 290 ms); two replicas read ~252 ms."""


def scenario(rate: float, minutes: float, p0_ttft_ms: float) -> Scenario:
    data = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["name"], data["duration_s"] = "lowtraffic", minutes * 60
    workload = data["workload"]
    workload["arrivals"]["rate"] = rate
    workload.pop("shift")
    workload["prompt_tokens"] = {"dist": "lognormal", "mean": 1536, "sigma": 0.5,
                                 "min": 256, "max": 3072}
    workload["classes"] = {"p0": 0.4, "p1": 0.5, "p2": 0.1}
    data["slo"]["classes"]["p0"]["ttft_p99_ms"] = p0_ttft_ms
    return parse_scenario(data, source="lowtraffic")


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
