"""The workload probes plan a bursty load as bursty: gamma arrivals at the cv the last
window's 15 s bins read, not Poisson at its rate (which read a cv 4 load as calm: the
loop scaled 6 -> 3 and six of the next eight windows breached)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.sim.arrivals import Gamma, Poisson
from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.tuner.sim.adapters import SimProbe

ROOT = Path(__file__).resolve().parents[2]


def bursty_scenario(process: dict[str, Any], minutes: float = 5.0, *,
                    classes: dict[str, float] | None = None,
                    slo: dict[str, Any] | None = None) -> Scenario:
    data = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["duration_s"] = minutes * 60
    data["workload"].pop("shift")
    data["workload"]["arrivals"] = process
    if classes is not None:
        data["workload"]["classes"] = classes
    if slo is not None:
        data["slo"] = slo
    return parse_scenario(data, source="bursty")


def _arrivals(scenario: Scenario) -> Any:
    return scenario.workload.phases[0].arrivals  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_simulated_probe_plans_a_gamma_load_as_gamma(seed: int) -> None:
    sc = bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 4.0})
    cluster = SimCluster(sc, dict(sc.engine), replicas=1, seed=seed)
    cluster.advance(300.0)
    planned = _arrivals(SimProbe(cluster, window_s=300).measure(300.0))
    assert isinstance(planned, Gamma) and 2.5 <= planned.cv <= 5.5
    # The benchmark's "before": every load planned as Poisson.
    before = _arrivals(SimProbe(cluster, window_s=300, poisson_only=True).measure(300.0))
    assert isinstance(before, Poisson)


def test_the_simulated_probe_plans_a_poisson_load_as_poisson() -> None:
    sc = bursty_scenario({"process": "poisson", "rate": 2.0})
    cluster = SimCluster(sc, dict(sc.engine), replicas=1, seed=0)
    cluster.advance(300.0)
    assert isinstance(_arrivals(SimProbe(cluster, window_s=300).measure(300.0)), Poisson)


def test_a_bursty_loads_runs_hold_cv_squared_times_the_floor() -> None:
    from slopilot.tuner.study.sample_floor import SIM_MIN_CLASS_REQUESTS, burst_floor

    assert burst_floor(bursty_scenario({"process": "poisson", "rate": 2.0})) == \
        SIM_MIN_CLASS_REQUESTS
    assert burst_floor(bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 4.0})) == \
        16 * SIM_MIN_CLASS_REQUESTS
    assert burst_floor(bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 0.5})) == \
        SIM_MIN_CLASS_REQUESTS  # smoother than Poisson: no fewer


def test_a_bursty_run_capped_short_of_its_floor_takes_no_scale_down() -> None:
    """Half the requests P0 at 2 req/s: 200 of them in ~250 s on Poisson arrivals, where
    gamma cv 4 needs 3200, past the 600 s cap: every count is short, none fewer holds."""
    from slopilot.tuner.loop.capacity import CapacityPlanner

    def search(process: dict[str, Any]) -> Any:
        sc = bursty_scenario(process, classes={"p0": 0.5, "p1": 0.5}, slo={
            "classes": {c: {"ttft_p99_ms": 60_000, "tbt_p99_ms": 60_000} for c in ("p0", "p1")},
            "max_preemptions_per_min": 1e6})
        return CapacityPlanner(seed=0, max_duration_s=600.0).search(
            sc, dict(sc.engine), 1, 2, margin=0.2)

    poisson = search({"process": "poisson", "rate": 2.0})
    assert poisson.replicas == 1 and poisson.short == {} and poisson.fewer_hold(2)
    bursty = search({"process": "gamma", "rate": 2.0, "cv": 4.0})
    assert bursty.replicas == 1 and 1 in bursty.short and bursty.short[1].capped
    assert not bursty.fewer_hold(2)
