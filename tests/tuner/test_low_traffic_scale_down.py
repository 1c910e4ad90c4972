"""At low traffic the capacity oracle's simulated run must hold enough requests of each
judged class for its P99 to say whether fewer replicas hold.

At 0.3 req/s a 120 s simulation held ~14 P0 requests, resampled from ~36 observed, and
its P99 (their maximum) said one replica holds in a quarter of the probes where one
truly reads 1.08 x the SLO: the loop scaled down, breached and scaled up again.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import yaml

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import parse_scenario
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.capacity import CapacityAnswer, CapacityPlanner
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.study.sample_floor import SIM_MIN_CLASS_REQUESTS, long_enough, shortfall
from tests.docs.test_doc_references import ROOT
from tests.support.summaries import figures, window
from tests.tuner.low_traffic import ONE_REPLICA_P99_MS, run, scenario

SLO_MS = round(ONE_REPLICA_P99_MS / 1.08)  # one replica misses by 8 %


def test_two_replicas_are_kept_where_one_truly_misses_by_8_percent() -> None:
    # Seed 0 scaled 2 -> 1 at 915 s on the 120 s oracle (then breached and retuned).
    _, ticks = run(0.3, SLO_MS, 20, seed=0, replicas=2)
    downs = [(t, d.reason) for t, d in ticks
             if d.action is Action.SCALE and d.reason.startswith("scale_down")]
    assert downs == []


def test_the_oracle_simulates_until_the_least_judged_class_reaches_the_floor() -> None:
    sc = scenario(0.3, 2, SLO_MS)
    answer = CapacityPlanner(seed=0).search(sc, dict(sc.engine), 1, 2, margin=0.2)
    assert answer.results and answer.short == {}
    for r in answer.results.values():
        assert r.summary is not None
        assert shortfall(r.summary, sc.slo, SIM_MIN_CLASS_REQUESTS, 0.0) is None


def test_where_the_cap_binds_fewer_replicas_are_never_said_to_hold() -> None:
    sc = scenario(0.3, 2, 10_000.0)  # every count holds, on however few requests
    answer = CapacityPlanner(seed=0, max_duration_s=300.0).search(
        sc, dict(sc.engine), 1, 2, margin=0.2)
    assert answer.replicas == 1 and 1 in answer.short
    assert not answer.fewer_hold(2)
    why = answer.why_short(2)
    assert why is not None and "too little traffic" in why and "of 200 requests" in why


def test_the_warm_start_study_runs_as_long_as_the_floor_needs() -> None:
    from slopilot.tuner.sim.adapters import SimOffline
    from slopilot.tuner.study.space import SearchSpace

    sc = scenario(0.3, 2, SLO_MS)
    offline = SimOffline(SearchSpace.from_bounds(base=sc.engine_config()), seed=0)
    # 180 s hold ~22 P0 requests at 0.12 P0/s: ~2000 s hold the floor
    assert 1500.0 < offline._duration(sc, 1, dict(sc.engine)) <= 3600.0


def _low_p0(seed_rate: float = 0.5) -> Any:
    data = copy.deepcopy(yaml.safe_load(
        (ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()))
    data["workload"].pop("shift", None)
    data["workload"]["arrivals"]["rate"] = seed_rate
    data["workload"]["classes"] = {"p0": 0.2, "p1": 0.5, "p2": 0.3}  # P0 0.1/s
    return parse_scenario(data, source="lowp0")


@pytest.mark.parametrize("seed", [3, 4, 7])
def test_a_rerun_short_of_the_floor_below_the_cap_is_lengthened_again(seed: int) -> None:
    # P0 at 0.1/s holds ~360 in the cap's hour; these seeds' 120 s runs overestimated
    # the rate, and the one rerun (2000, 1765, 1875 s) fell short and was refused as
    # "the cap" though the cap was never reached.
    sc = _low_p0()
    answer = CapacityPlanner(seed=seed).search(sc, sc.engine_config().to_dict(), 1, 3,
                                               margin=0.2)
    assert answer.short == {} and answer.fewer_hold(3)


def test_a_rerun_aims_past_the_floor_until_it_holds_it_or_reaches_the_cap() -> None:
    # A first run whose count flatters the rate two-fold: its rerun falls short, and the
    # next one holds the floor well below the cap.
    lengths: list[float] = []

    def at(d: float) -> WindowSummary:
        lengths.append(d)
        p0 = 0.2 * d if d <= 120 else 0.1 * d
        return window({"p0": figures(100.0, 10.0, finished=p0)}, duration_s=d)

    sc = scenario(0.3, 2, SLO_MS)
    summary, short = long_enough(at, sc.slo, 120.0, floor=200, max_duration_s=3600.0)
    assert short is None and summary.classes[Priority.P0].requests_finished >= 200
    assert lengths[0] == 120 and lengths[-1] < 3600 and len(lengths) >= 3


def test_only_a_run_that_reached_the_cap_is_said_to_have() -> None:
    def at(d: float) -> WindowSummary:
        return window({"p0": figures(100.0, 10.0, finished=0.01 * d)}, duration_s=d)

    sc = scenario(0.3, 2, SLO_MS)
    _, short = long_enough(at, sc.slo, 120.0, floor=200, max_duration_s=3600.0)
    assert short is not None and short.duration_s == 3600 and short.capped
    answer = CapacityAnswer(replicas=1, short={1: short})
    assert "(the cap)" in (answer.why_short(2) or "")
    early = dataclasses.replace(short, duration_s=1800.0, capped=False)
    why = CapacityAnswer(replicas=1, short={1: early}).why_short(2)
    assert why is not None and "the cap" not in why
