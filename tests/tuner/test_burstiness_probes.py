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


def test_a_bursty_loads_runs_hold_cv_squared_times_the_floor_up_to_nine() -> None:
    """cv^2 times, at most 9 (cv 3): at cv 6 one capacity search ran past the simulator
    worker's 300 s limit and answered nothing (30 req/s, 1-8 replicas: 272 s)."""
    from slopilot.tuner.study.sample_floor import SIM_MIN_CLASS_REQUESTS, burst_floor

    assert burst_floor(bursty_scenario({"process": "poisson", "rate": 2.0})) == \
        SIM_MIN_CLASS_REQUESTS
    assert burst_floor(bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 2.0})) == \
        4 * SIM_MIN_CLASS_REQUESTS
    assert burst_floor(bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 4.0})) == \
        9 * SIM_MIN_CLASS_REQUESTS
    assert burst_floor(bursty_scenario({"process": "gamma", "rate": 2.0, "cv": 6.0})) == \
        9 * SIM_MIN_CLASS_REQUESTS
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


def _raw_counters(process: Any, replicas: int, seed: int, now: float, *,
                  spacing: float = 15.0, name_label: str = "instance") -> list[dict]:
    """Each replica's raw arrivals-counter samples over the 600 s before ``now``, scraped
    every ``spacing``, as Prometheus answers ``counter[600s]``; replica 1 restarted
    half-way (its counter from zero), replica 2 started 200 s before ``now``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    times = np.array(list(process.times(rng, now - 900.0, now)))
    who = rng.integers(0, replicas, len(times))
    out = []
    for i in range(replicas):
        mine = times[who == i]
        born = now - 200.0 if i == 2 else now - 900.0
        values = []
        for t in np.arange(now - 600.0 + 7.0, now + 1e-9, spacing):
            if t < born:
                continue
            n = float(np.sum((mine <= t) & (mine >= born)))
            if i == 1 and t > now - 300.0:  # restarted: counts from zero again
                n = float(np.sum((mine <= t) & (mine > now - 300.0)))
            values.append([float(t), str(n + (500.0 if i == 0 else 0.0))])
        out.append({"metric": {name_label: f"r{i}", "priority_class": "p1"},
                    "values": values})
    return out


def _probe(raw: dict[str, list[dict]]) -> Any:
    """A PrometheusProbe over recorded answers, and the raw samples in ``raw`` (by the
    counter each range vector reads)."""
    from slopilot.tuner.prometheus.adapters import PrometheusProbe
    from tests.tuner.test_profiling import _answers, _recorded

    answers = _recorded({**_answers(), "num_requests_running{": [{"metric": {},
                                                                "value": [0, "1"]}]})

    def query(expr: str, at: float | None) -> list:
        for name, series in raw.items():
            if expr.startswith(name + "{") and expr.endswith("[10m]"):
                return series
        return answers(expr)  # type: ignore[operator]
    base = bursty_scenario({"process": "poisson", "rate": 2.0})
    return PrometheusProbe(query, {"d": "x"}, base, window_s=120, duration_s=60.0)


@pytest.mark.parametrize("counter", ["slopilot_requests_arrived_total",
                                     "slopilot_meter_arrivals_total"])
def test_the_prometheus_probe_plans_gamma_from_an_arrivals_counters_raw_samples(
        counter: str) -> None:
    now = 10_000.0
    raw = _raw_counters(Gamma(rate=6.0, cv=4.0), 3, 0, now)
    planned = _arrivals(_probe({counter: raw}).measure(now))
    assert isinstance(planned, Gamma) and 2.5 <= planned.cv <= 5.5
    calm = _raw_counters(Poisson(rate=6.0), 3, 0, now)
    assert isinstance(_arrivals(_probe({counter: calm}).measure(now)), Poisson)


def test_without_an_arrivals_counter_the_probe_keeps_the_bases_process() -> None:
    scenario = _probe({}).measure(10_000.0)
    assert isinstance(_arrivals(scenario), Poisson)
    assert "burstiness not measured (no replica exports an arrivals counter" in \
        scenario.description


@pytest.mark.parametrize(("process", "gamma"), [(Gamma(rate=6.0, cv=4.0), True),
                                                (Poisson(rate=6.0), False)])
def test_the_demos_scrape_probe_reads_the_burstiness_of_its_direct_scrapes(
        process: Any, gamma: bool) -> None:
    """Two built-in replicas counting their arrivals (``slopilot_requests_arrived_total``),
    scraped every 15 s for 10 minutes."""
    import numpy as np

    from slopilot.engine.metrics import EngineMetrics
    from slopilot.engine.request import Priority
    from slopilot.tuner.local.scrape_probe import ScrapeProbe
    from tests.support.served_workload import Pages, serve
    from tests.tuner.test_scrape_probe import scraping

    times = np.array(list(process.times(np.random.default_rng(0), 0.0, 600.0)))
    replicas = [(EngineMetrics("demo"), Pages()) for _ in range(2)]
    with scraping(*(p for _, p in replicas)) as scrape:
        for k, t in enumerate(np.arange(0.0, 600.0 + 1e-9, 15.0)):
            for i, (metrics, pages) in enumerate(replicas):
                came = times[(times > t - 15.0) & (times <= t)] if k else []
                for _ in came[i::2]:
                    metrics.count_arrived(Priority.P1)
                if t == 600.0:
                    serve(metrics, 20, 512, seed=i)
                pages.take(metrics)
            scrape.poll(now=float(t))
        base = bursty_scenario({"process": "poisson", "rate": 2.0})
        planned = _arrivals(ScrapeProbe(scrape, base, window_s=120).measure(600.0))
    assert isinstance(planned, Gamma) is gamma
    if gamma:
        assert 2.5 <= planned.cv <= 5.5


def test_raw_samples_past_the_answers_bound_leave_the_rest_of_the_profile() -> None:
    """Hundreds of replicas scraped every second: 10 minutes of raw samples pass the 8 MiB
    an answer may hold. The profile stands, the arrivals planned as designed."""
    from slopilot.tuner.study.evaluator import PrometheusUnavailable

    probe = _probe({})
    inner = probe.query

    def query(expr: str, at: float | None) -> list:
        if expr.endswith("[10m]"):
            raise PrometheusUnavailable("the answer is past 8 MiB")
        return inner(expr, at)  # type: ignore[no-any-return]
    probe.query = query
    scenario = probe.measure(10_000.0)
    assert isinstance(_arrivals(scenario), Poisson) and "past 8 MiB" in scenario.description
    assert _arrivals(scenario).rate == pytest.approx(110 / 120, abs=1e-4)


def test_a_clients_invalid_requests_are_no_burst_of_load() -> None:
    """Reviewer's repro: the meter counts a request its engine refuses as invalid (a
    client's 400s) among its arrivals; binned raw, 600 of them in two bursts read a
    smooth 4 req/s as cv 6, the cap. The rate took them off; so do the bins now."""
    from slopilot.tuner.prometheus.profiling import raw_arrivals

    end = 10_000.0
    steady = [(end - 600 + 15 * k, 60.0 * k) for k in range(1, 41)]

    def spammed(t: float) -> float:
        return (300.0 if t > end - 400 else 0.0) + (300.0 if t > end - 100 else 0.0)

    def query(series: dict[str, list[tuple[float, float]]]) -> Any:
        def run(expr: str) -> list[dict[str, Any]]:
            rows = series.get(expr.split("{")[0].split("[")[0])
            return [] if rows is None else [{
                "metric": {"instance": "a:8000", "priority_class": "p1"},
                "values": [[t, str(v)] for t, v in rows]}]
        return run

    calm = raw_arrivals(query({"slopilot_meter_arrivals_total": steady}), {}, 120, end)
    spam = raw_arrivals(query({
        "slopilot_meter_arrivals_total": [(t, v + spammed(t)) for t, v in steady],
        "slopilot_meter_invalid_total": [(t, spammed(t)) for t, _ in steady]}), {}, 120, end)
    assert calm.cv is not None and not calm.bursty
    assert spam.cv == pytest.approx(calm.cv, abs=0.05) and not spam.bursty, spam


def test_the_demos_scrape_takes_the_meters_invalid_requests_off_as_prometheus_does() -> None:
    """A meter in front of an engine counts a client's 400s among its arrivals; the
    Prometheus probe takes them off (``minus``), and the demo's own scrapes did not: a
    burst of 600 invalid requests read a smooth 4 req/s as cv 6."""
    from slopilot.engine.meter.exposition import ARRIVALS, INVALID
    from slopilot.engine.slo import SLOSpec
    from slopilot.tuner.local.scrape import DirectScrape, _Snapshot
    from slopilot.tuner.prometheus.rules import RuleOptions

    scrape = DirectScrape(lambda: [], SLOSpec.from_profile("standard"), RuleOptions(),
                          interval_s=15.0)
    for k in range(41):
        t = 600.0 + 15 * k
        spam = (300.0 if t > 800 else 0.0) + (300.0 if t > 1100 else 0.0)
        series = {(ARRIVALS, "p1", -1.0): 60.0 * k + spam, (INVALID, "p1", -1.0): spam}
        scrape._snaps.append((t, _Snapshot({"http://a": series}, None)))
    b = scrape.burstiness(600.0, 1200.0)
    assert b.cv is not None and b.cv < 1.2 and not b.bursty, b
