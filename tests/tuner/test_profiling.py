"""WorkloadProfile: fits from histograms, a live engine measured through real Prometheus,
and the scenario it becomes."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slopilot.engine.metrics import TOKEN_BUCKETS
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.tuner.prometheus.adapters import PrometheusProbe
from slopilot.tuner.prometheus.profiling import (
    LengthProfile,
    ProfileError,
    WorkloadProfile,
    length_profile,
    prometheus_query,
)
from slopilot.tuner.study.evaluator import PrometheusUnavailable
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.ports import refused_port
from tests.support.prometheus import PrometheusBinaries
from tests.support.waits import wait_for
from tests.tuner.live_stack import SELECTOR, live_stack


def _histogram(values: np.ndarray) -> dict[float, float]:
    edges = [*TOKEN_BUCKETS, math.inf]
    return {e: float(np.sum(values <= e)) for e in edges}


@pytest.mark.parametrize(("mean", "sigma"), [(512, 0.7), (64, 0.5), (2048, 1.2)])
def test_lognormal_fit_from_power_of_two_buckets(mean: float, sigma: float) -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, 20_000)
    fit = length_profile(_histogram(values), float(values.sum()), float(len(values)))
    assert fit.mean == pytest.approx(values.mean())
    assert fit.sigma == pytest.approx(sigma, abs=0.08)
    # The last finite bucket edge caps what a histogram can say about the longest.
    assert fit.lo <= values.min() * 2 and fit.hi >= min(values.max(), TOKEN_BUCKETS[-1])


def test_fixed_length_fits_zero_spread_and_empty_window_is_refused() -> None:
    fit = length_profile(_histogram(np.full(50, 12.0)), 600.0, 50.0)
    assert fit.mean == 12.0 and fit.sigma == 0.0
    with pytest.raises(ProfileError, match="no finished requests"):
        length_profile({1.0: 0.0, math.inf: 0.0}, 0.0, 0.0)


def _recorded(answers: dict[str, list]) -> object:
    """A PrometheusQuery that answers from recorded results by metric name."""
    def query(expr: str) -> list:
        for key, result in answers.items():
            if key in expr:
                return result
        return []
    return query


def _sample(value: float, **labels: str) -> dict:
    return {"metric": labels, "value": [0, str(value)]}


def _answers(**over: list) -> dict[str, list]:
    prompt_b = [_sample(v, le=str(e)) for e, v in ((256.0, 0), (512.0, 40), (1024.0, 100),
                                                   (math.inf, 100))]
    return {
        "request_prompt_tokens_count": [_sample(20, priority_class="p0"),
                                        _sample(80, priority_class="p1")],
        "request_prompt_tokens_bucket": prompt_b,
        "request_prompt_tokens_sum": [_sample(60_000)],
        "request_generation_tokens_bucket": [_sample(100, le="64.0"),
                                             _sample(100, le="+Inf")],
        "request_generation_tokens_sum": [_sample(5_000)],
        "request_generation_tokens_count": [_sample(100)],
        "num_requests_running": [_sample(10)], **over}


def test_profile_from_recorded_query_results_becomes_a_scenario() -> None:
    answers = _answers()
    prof = WorkloadProfile.measure(_recorded(answers), SELECTOR, 50)  # type: ignore[arg-type]
    assert prof.arrival_rate == pytest.approx((100 + 10) / 50)
    assert prof.class_mix == {"p0": 0.2, "p1": 0.8, "p2": 0.0}
    assert prof.prompt.mean == 600 and prof.output.mean == 50
    scenario = prof.to_scenario(load_scenario("tiny-cpu"), duration_s=20)
    assert (scenario.gpu, scenario.model) == ("A100", "llama-3-8b")
    assert scenario.slo == load_scenario("tiny-cpu").slo
    run = simulate(scenario, duration_s=20)
    assert run.summary.classes[Priority.P2].requests_finished == 0
    assert run.summary.overall.requests_finished > 20
    with pytest.raises(ProfileError, match="only 100 requests finished"):
        WorkloadProfile.measure(_recorded(answers), SELECTOR, 50,  # type: ignore[arg-type]
                                min_requests=500)


def test_the_requests_turned_away_for_load_are_part_of_the_workload() -> None:
    """A deployment turning clients away (429) was offered them: the twin plans for the
    load that arrived, not for the share its config let in. Left out, a saturated
    deployment measured its own throughput as the load, and the capacity plan found the
    replicas it had enough while the TTFT alerts read 300 s."""
    answers = _answers(requests_refused_total=[_sample(40, priority_class="p1")])
    prof = WorkloadProfile.measure(_recorded(answers), SELECTOR, 50)  # type: ignore[arg-type]
    assert prof.arrival_rate == pytest.approx((100 + 10 + 40) / 50)
    assert prof.class_mix == pytest.approx({"p0": 20 / 140, "p1": 120 / 140, "p2": 0.0})
    # The lengths are the finished requests' alone: a refused one told none.
    assert prof.prompt.mean == 600 and prof.output.mean == 50


def test_zero_rate_profile_cannot_become_a_scenario() -> None:
    flat = LengthProfile(10, 0, 10, 10)
    prof = WorkloadProfile(0.0, flat, flat, {"p1": 1.0}, 60, 0)
    with pytest.raises(ProfileError, match="arrival rate is zero"):
        prof.to_scenario(load_scenario("tiny-cpu"))


@pytest.mark.prometheus
@pytest.mark.slow
def test_live_engine_profile_through_real_prometheus(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    with live_stack(prometheus_binaries, tmp_path, rate=6.0) as s:
        loaded = time.time()  # the load has run long enough for finished requests

        def measured() -> tuple[WorkloadProfile, float] | None:
            # A window that lies inside the load (after ``loaded``): 5 s at least, as long
            # as the load has run where this machine finished too few in 5 s (a fixed 20
            # in 5 s never came on a box finishing < 4/s). Under 60 s: the burstiness
            # verdict below needs 120 s of bins.
            at = time.time()
            window = min(60, math.floor(at - loaded))
            if window < 5:
                return None
            try:
                # 12: three rounds of the generator's four classes, for the mix.
                return WorkloadProfile.from_prometheus(
                    s.prometheus.url, SELECTOR, window, min_requests=12), at
            except ProfileError:
                return None  # the first scrapes hold too little of the window yet

        prof, at = wait_for(measured, what="a window with 12 finished requests")
        sent = s.load.sent_between(at - prof.window_s, at) / prof.window_s
    # Every request asks for 12 tokens (increase() extrapolates: not quite exact).
    assert prof.output.mean == pytest.approx(12.0, rel=0.02)
    assert prof.output.sigma < 0.05
    assert prof.prompt.sigma < 0.2  # one prompt, a fixed length
    # The rate the generator sent in the window (6/s where its thread is not starved);
    # arrivals lag sends by the HTTP hop, and increase() extrapolates at the edges.
    assert sent / 3 < prof.arrival_rate < sent * 2, (prof.arrival_rate, sent)
    assert prof.class_mix["p1"] == pytest.approx(0.5, abs=0.2)  # p0, p1, p1, p2 in turn
    scenario = prof.to_scenario(load_scenario("tiny-cpu"), duration_s=10)
    assert simulate(scenario).summary.overall.requests_finished > 10
    # The arrivals counter's raw samples were read (a matrix answer; it was refused as
    # "not a Prometheus result"): a few seconds of load hold too few 15 s bins for a
    # verdict, and say so.
    burst = prof.burstiness
    assert burst is not None and burst.why_none is not None, burst
    assert "complete bins" in burst.why_none, burst.why_none


def test_unreachable_prometheus_is_named() -> None:
    with pytest.raises(PrometheusUnavailable, match="cannot reach Prometheus"):
        WorkloadProfile.from_prometheus(f"http://127.0.0.1:{refused_port()}", SELECTOR, 60,
                                        timeout_s=2)
    with pytest.raises(ValueError, match="window_s=0"):
        WorkloadProfile.measure(prometheus_query("http://127.0.0.1:9"), SELECTOR, 0)


def test_a_measured_workload_keeps_the_twins_calibrated_profile() -> None:
    from slopilot.engine.sim.twin import twin_label, with_profile
    from tests.support.profiles import make_profile

    flat = LengthProfile(100, 0, 100, 100)
    prof = WorkloadProfile(2.0, flat, flat, {"p1": 1.0}, 60, 120)
    base = with_profile(load_scenario("tiny-cpu"), make_profile())
    measured = prof.to_scenario(base, duration_s=10)
    assert measured.profile is base.profile
    assert twin_label(measured) == twin_label(base)
    run = simulate(measured).summary.run
    assert run is not None and run.calibrated


@pytest.mark.parametrize("policy", ["round_robin", "least_requests"])
def test_a_measured_workload_keeps_the_twins_dispatch(policy: str) -> None:
    """The live twin is the base's deployment under the measured load: behind the same
    load balancer too (the demo's twin sends in turn, as its load generator does)."""
    import dataclasses

    from slopilot.engine.sim.dispatch import Dispatch

    flat = LengthProfile(100, 0, 100, 100)
    prof = WorkloadProfile(2.0, flat, flat, {"p1": 1.0}, 60, 120)
    base = dataclasses.replace(load_scenario("tiny-cpu"), dispatch=Dispatch(policy))
    assert prof.to_scenario(base, duration_s=10).dispatch is Dispatch(policy)



@pytest.mark.parametrize(("over", "message"), [
    ({"request_prompt_tokens_count": [_sample(math.inf, priority_class="p0"),
                                      _sample(80, priority_class="p1")]},
     r"vllm:request_prompt_tokens_count\{priority_class=p0\} read inf"),
    ({"request_prompt_tokens_count": [_sample(-50, priority_class="p0"),
                                      _sample(80, priority_class="p1")]}, "read -50"),
    ({"request_prompt_tokens_sum": [_sample(math.inf)]}, "_sum read inf"),
    ({"request_prompt_tokens_sum": [_sample(math.nan)]}, "_sum read nan"),
    ({"request_prompt_tokens_sum": [_sample(-5)]}, "_sum read -5"),
    ({"request_prompt_tokens_bucket": [_sample(-100, le="512.0"), _sample(100, le="+Inf")]},
     r"_bucket\{le=512\} read -100"),
    ({"num_requests_running": [_sample(math.inf)]}, "queue's growth read inf"),
    # 100 finished requests' prompts summing to a ten-thousandth of a token.
    ({"request_prompt_tokens_sum": [_sample(1e-4)]}, "prompt_tokens.mean"),
    # The queue grew by 1e12 in 50 s: 2e10 requests a second for the twin to simulate.
    ({"num_requests_running": [_sample(1e12)]}, r"2e\+10 requests a second"),
])
def test_a_workload_no_engine_can_export_is_no_profile(over: dict[str, list],
                                                       message: str) -> None:
    """The histograms are each pod's /metrics as its image wrote them. A figure no engine
    gives (infinite, NaN, negative, prompts of no length, a queue that grew by 1e12)
    raised OverflowError, ValueError or ScenarioError out of the probe, which the loop
    took for a controller error (a rollback at each tick), or became a workload of 2e10
    requests a second that the simulator processes, which every deployment shares, ran
    until its time limit killed them. It is no profile: the twin plans for the base."""
    query = _recorded(_answers(**over))
    with pytest.raises(ProfileError, match=message) as err:
        WorkloadProfile.measure(query, SELECTOR, 50).to_scenario(  # type: ignore[arg-type]
            load_scenario("tiny-cpu"), duration_s=60)
    assert "/metrics" in str(err.value)
    base = load_scenario("tiny-cpu")
    probe = PrometheusProbe(lambda expr, at: query(expr), SELECTOR, base,  # type: ignore
                            window_s=50)
    assert probe.measure(100.0) is base


def test_the_prompts_are_the_started_requests_where_enough_started() -> None:
    """Right after a shift to long prompts, the requests that finished in the window are
    mostly the old, short ones (a histogram of prompt lengths is observed at the finish,
    in vLLM as here), and the twin check, the warm start and the capacity plan simulated
    them. The prompt counter is counted where each prefill is done: its mean over the
    requests that got their first token in the window is the new load's."""
    answers = _answers(prompt_tokens_total=[_sample(100 * 2_400)],
                       time_to_first_token_seconds_count=[_sample(100)])
    prof = WorkloadProfile.measure(_recorded(answers), SELECTOR, 50)  # type: ignore[arg-type]
    finished = WorkloadProfile.measure(_recorded(_answers()), SELECTOR, 50)  # type: ignore[arg-type]
    assert finished.prompt.mean == 600
    assert prof.prompt.mean == 2_400
    # The spread is the finished requests' (no histogram of started ones), scaled.
    assert prof.prompt.sigma == finished.prompt.sigma
    assert prof.prompt.lo == pytest.approx(finished.prompt.lo * 4)
    assert prof.prompt.hi == pytest.approx(finished.prompt.hi * 4)
    # The outputs, the rate and the mix are as before: no output is known at its start.
    assert (prof.output, prof.arrival_rate, prof.class_mix) == \
        (finished.output, finished.arrival_rate, finished.class_mix)


@pytest.mark.parametrize("started", [0, 5])
def test_too_few_started_requests_leave_the_finished_prompts(started: int) -> None:
    answers = _answers(prompt_tokens_total=[_sample(started * 2_400)],
                       time_to_first_token_seconds_count=[_sample(started)])
    prof = WorkloadProfile.measure(_recorded(answers), SELECTOR, 50,  # type: ignore[arg-type]
                                   min_requests=20)
    assert prof.prompt.mean == 600


@pytest.mark.parametrize(("tokens", "started"), [(-5.0, 100.0), (math.inf, 100.0),
                                                 (1e6, -1.0), (math.nan, 100.0)])
def test_a_started_count_no_engine_exports_is_refused(tokens: float, started: float) -> None:
    from slopilot.tuner.prometheus.profiling import ImplausibleWorkload

    answers = _answers(prompt_tokens_total=[_sample(tokens)],
                       time_to_first_token_seconds_count=[_sample(started)])
    with pytest.raises(ImplausibleWorkload, match="which no engine"):
        WorkloadProfile.measure(_recorded(answers), SELECTOR, 50)  # type: ignore[arg-type]


def _vllm_token_buckets(max_model_len: int) -> list[float]:
    """vLLM's edges for its token-count histograms (``build_1_2_5_buckets``): 1, 2, 5,
    10, 20, 50, ... up to the model's context."""
    out, exponent = [], 0
    while True:
        for m in (1, 2, 5):
            edge = m * 10**exponent
            if edge > max_model_len:
                return [float(e) for e in out]
            out.append(edge)
        exponent += 1


@pytest.mark.parametrize(("mean", "sigma"), [(512, 0.7), (64, 0.5), (2048, 1.2), (300, 0.3),
                                             (40, 0.2), (1000, 0.15)])
@pytest.mark.parametrize("vllm", [True, False], ids=["vllm-1-2-5", "engine-powers-of-2"])
def test_lognormal_fit_from_either_backends_buckets(mean: float, sigma: float,
                                                    vllm: bool) -> None:
    """On vLLM the token histograms' edges are 1-2-5, not powers of two. Read off the
    buckets' midpoints with a correction for ln 2 wide buckets, a spread of 0.3 read
    0.25, 0.2 read 0.09 and 0.15 read 0.28 there: the fit is now the lognormal of the
    measured mean most likely to have filled those buckets, whatever their edges."""
    rng = np.random.default_rng(0)
    values = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, 20_000)
    edges = [*(_vllm_token_buckets(32_768) if vllm else TOKEN_BUCKETS), math.inf]
    buckets = {e: float(np.sum(values <= e)) for e in edges}
    fit = length_profile(buckets, float(values.sum()), float(len(values)))
    assert fit.mean == pytest.approx(values.mean())
    assert fit.sigma == pytest.approx(sigma, abs=0.02)


def test_one_measurement_reads_every_series_at_one_instant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each query ran at Prometheus' "now": a scrape landing between the output lengths'
    ``_sum`` and ``_count`` queries read a mean of 10.8 tokens where every request asked
    for 12 (a loaded CI machine, the live profile test). One instant for them all."""
    times: list[float | None] = []

    def fake_query_at(url: str, timeout_s: float = 5.0, **_: Any) -> Any:
        def run(expr: str, at: float | None = None) -> list[dict[str, Any]]:
            times.append(at)
            return []
        return run

    monkeypatch.setattr("slopilot.tuner.prometheus.profiling.query_at", fake_query_at)
    with pytest.raises(ProfileError):
        WorkloadProfile.from_prometheus("http://prometheus:9090", SELECTOR, 60)
    assert len(times) > 3 and times[0] is not None and len(set(times)) == 1, times
