"""The workload probe on vLLM behind the meter: the offered load is what arrived.

vLLM (0.11.0, the pinned image) drops a request whose client gave up (a disconnect, a
client's timeout) from every series it observes at the finish, and from its running and
waiting gauges once aborted (``v1/engine/output_processor.py:325-334``). Finished +
refused + the queue's growth then reads the load its clients gave up on as never offered:
in the overload the loop acts on (clients time out while the TTFT grows), the twin, the
warm start and the capacity plan planned for less than came. The meter in front of each
vLLM engine counts each request as it arrives (``slopilot_meter_arrivals_total``); where
a replica exports it, the probe reads its arrivals from it.

A request vLLM refuses as invalid (a prompt past the context, a bad parameter, no such
model) is counted there too as it came, and again as invalid once answered
(``slopilot_meter_invalid_total``): the probe takes each replica's off its arrivals, so a
client retrying one in a loop is no load to plan replicas for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.tuner.prometheus.profiling import WorkloadProfile, prometheus_increases
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool
from tests.tuner.live_stack import SELECTOR
from tests.tuner.test_profiling import _answers, _recorded, _sample

ARRIVALS = "slopilot_meter_arrivals_total"
INVALID = "slopilot_meter_invalid_total"
E2E = "vllm:e2e_request_latency_seconds_count"
REFUSED = "slopilot_requests_refused_total"


def _behind_meters(answers: dict[str, list], unmetered: dict[str, list]) -> Any:
    """A PrometheusQuery answering the deployment's series from ``answers`` and the
    series of its replicas without the meter's count (``unless on (instance)``) from
    ``unmetered`` (none where every replica is metered)."""
    every, others = _recorded(answers), _recorded(unmetered)

    def query(expr: str) -> list:
        return others(expr) if "unless" in expr else every(expr)  # type: ignore[operator]
    return query


def test_on_vllm_the_requests_whose_clients_gave_up_were_offered_too() -> None:
    """100 finished in vLLM's series (20 p0, 80 p1); the meters saw 140 arrive (50, 90):
    40 clients gave up waiting, in none of vLLM's series, nor in its queue any longer.
    The gauges' growth (10) is of requests the meters counted already."""
    answers = _answers(**{ARRIVALS: [_sample(50, priority_class="p0"),
                                     _sample(90, priority_class="p1")]})
    prof = WorkloadProfile.measure(_behind_meters(answers, {}), SELECTOR, 50)
    assert prof.arrival_rate == pytest.approx(140 / 50)
    assert prof.class_mix == pytest.approx({"p0": 50 / 140, "p1": 90 / 140, "p2": 0.0})
    # The lengths, and the requests the window holds, are still the finished ones'.
    assert prof.requests == 100 and prof.prompt.mean == 600 and prof.output.mean == 50
    plain = WorkloadProfile.measure(_recorded(_answers()), SELECTOR, 50)  # type: ignore[arg-type]
    assert plain.arrival_rate == pytest.approx((100 + 10) / 50)  # no meter: as before


def test_a_replica_without_the_meters_count_is_estimated_as_before() -> None:
    """Mid-rollout from an image without the count, one replica is metered (its 60 p0
    arrivals; its engine, the built-in one here, also turned 30 away, which the meter
    counted as they came: not again) and one is not (its 80 p1 finished, 5 turned away,
    its queue 10 longer: today's estimate). Read as a whole deployment's, the metered
    one's 60 would have been the load of both."""
    answers = _answers(**{ARRIVALS: [_sample(60, priority_class="p0")],
                          REFUSED: [_sample(30, priority_class="p0"),
                                    _sample(5, priority_class="p1")]})
    unmetered = {"request_prompt_tokens_count": [_sample(80, priority_class="p1")],
                 REFUSED: [_sample(5, priority_class="p1")],
                 "num_requests_running": [_sample(10)]}
    prof = WorkloadProfile.measure(_behind_meters(answers, unmetered), SELECTOR, 50)
    assert prof.arrival_rate == pytest.approx((60 + 80 + 5 + 10) / 50)
    assert prof.class_mix == pytest.approx({"p0": 60 / 145, "p1": 85 / 145, "p2": 0.0})


def test_arrivals_that_no_engine_exports_are_no_profile() -> None:
    from slopilot.tuner.prometheus.profiling import ImplausibleWorkload

    answers = _answers(**{ARRIVALS: [_sample(-3, priority_class="p0")]})
    with pytest.raises(ImplausibleWorkload, match=rf"{ARRIVALS}\{{priority_class=p0\}} "
                                                  "read -3"):
        WorkloadProfile.measure(_behind_meters(answers, {}), SELECTOR, 50)


def _queries(window_s: int) -> dict[str, str]:
    """The probe's queries where a replica exports the meter's count, by what they read."""
    asked: list[str] = []

    def query(expr: str) -> list:
        asked.append(expr)
        return [_sample(1, priority_class="p0", le="+Inf")]

    prometheus_increases(query, {"d": "x"}, window_s)
    unmetered = [e for e in asked if "unless" in e]
    return {"arrived": next(e for e in asked if ARRIVALS in e and "unless" not in e),
            "finished": next(e for e in unmetered if "request_prompt_tokens_count" in e),
            "refused": next(e for e in unmetered if REFUSED in e),
            "growth": next(e for e in unmetered if "num_requests_running" in e)}


def _promtool(binaries: PrometheusBinaries, tmp_path: Path, series: list[dict[str, str]],
              exprs: dict[str, str], want: dict[str, list[tuple[str, float]]]) -> None:
    """promtool's test of each expression at 10 minutes: its samples, rounded to 0.001."""
    test = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": f"round({exprs[key]}, 0.001)", "eval_time": "10m",
             "exp_samples": [{"labels": labels, "value": round(value, 3)}
                             for labels, value in samples]}
            for key, samples in want.items()]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_prometheus_reads_each_replicas_arrivals_where_its_meter_counts_them(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The queries on Prometheus' own engine: replica a's meter counts 1 p0 request a
    second (its engine also turned 0.2 away, and finished 0.5); replica b has no meter's
    count (2 p1 finished a second, 0.1 turned away, its queue 20 longer over the 5 min);
    a metered replica of another deployment is not this one's."""
    series: list[dict[str, str]] = []

    def add(name: str, values: str, **labels: str) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in {"d": "x", **labels}.items())
        series.append({"series": f"{name}{{{text}}}", "values": values})

    add(ARRIVALS, "0+60x10", instance="a", priority_class="p0", model_name="m")
    add(ARRIVALS, "0+600x10", d="y", instance="c", priority_class="p0", model_name="m")
    add("vllm:request_prompt_tokens_count", "0+30x10", instance="a", priority_class="p0")
    add(REFUSED, "0+12x10", instance="a", priority_class="p0")
    add("vllm:num_requests_running", "0+7x10", instance="a")
    add("vllm:num_requests_waiting", "0+9x10", instance="a")
    add("vllm:request_prompt_tokens_count", "0+120x10", instance="b", priority_class="p1")
    add(REFUSED, "0+6x10", instance="b", priority_class="p1")
    add("vllm:num_requests_running", "0+1x10", instance="b")
    add("vllm:num_requests_waiting", "0+3x10", instance="b")
    _promtool(prometheus_binaries, tmp_path, series, _queries(300), {
        "arrived": [('{priority_class="p0"}', 300)],
        "finished": [('{priority_class="p1"}', 600)],
        "refused": [('{priority_class="p1"}', 30)], "growth": [("{}", 20)]})


def _flooded() -> list[dict[str, str]]:
    """promtool's input series of a deployment whose clients retry invalid requests in a
    loop, over 10 minutes a minute apart. Replica a's meter counts 1 p0 request a second,
    of which vLLM refused 2/3 as invalid (a retry loop of 400s); replica e's counted 0.1
    p0 a second, and 0.2 refused as invalid, within the window of requests that came
    before it (as a window's edge can read it): none of a's arrivals, and not below 0;
    replica f's meter is of an image that counts no invalid ones (0.5 p1 a second);
    replica g of another deployment is not this one's."""
    series: list[dict[str, str]] = []

    def add(name: str, values: str, **labels: str) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in
                        {"d": "x", "model_name": "m", **labels}.items())
        series.append({"series": f"{name}{{{text}}}", "values": values})

    add(ARRIVALS, "0+60x10", instance="a", priority_class="p0")
    add(INVALID, "0+40x10", instance="a", priority_class="p0")
    add(ARRIVALS, "0+6x10", instance="e", priority_class="p0")
    add(INVALID, "0+12x10", instance="e", priority_class="p0")
    add(ARRIVALS, "0+30x10", instance="f", priority_class="p1")
    add(ARRIVALS, "0+600x10", d="y", instance="g", priority_class="p0")
    add(INVALID, "0+0x10", d="y", instance="g", priority_class="p0")
    return series


@pytest.mark.prometheus
def test_prometheus_takes_each_replicas_invalid_requests_off_its_arrivals(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The probe's arrivals over 5 minutes: a's 300 less its 200 invalid, e's 30 less its
    60 read as none, f's 150 whole. Before the invalid were taken off, the flood of 400s
    read as 330 p0 arrivals where the engines took on 100."""
    _promtool(prometheus_binaries, tmp_path, _flooded(), {"arrived": _queries(300)["arrived"]},
              {"arrived": [('{priority_class="p0"}', 100), ('{priority_class="p1"}', 150)]})


def _windows(answers: dict[str, float]) -> Any:
    """PrometheusWindows over a QueryAt answering each rate by the series it reads first,
    the meters' count or vLLM's finished requests, from ``answers`` (an empty vector where
    that series has no answer)."""
    import re

    from slopilot.engine.slo import SLOSpec
    from slopilot.tuner.prometheus.adapters import PrometheusWindows

    def query(expr: str, at: float | None) -> list:
        first = re.search(f"{re.escape(ARRIVALS)}|{re.escape(E2E)}", expr)
        return [_sample(answers[first.group()])] if first and first.group() in answers \
            else []
    return PrometheusWindows(query, {"d": "x"}, SLOSpec.from_profile("standard"))


@pytest.mark.parametrize(("answers", "want"), [
    # Every replica metered: the count alone (the estimate's vector is empty).
    ({ARRIVALS: 2.5}, 2.5),
    # One metered, one not: the count plus the other's estimate.
    ({ARRIVALS: 2.5, E2E: 1.5}, 4.0),
    # None metered: the estimate alone, as before.
    ({E2E: 1.5}, 1.5),
])
def test_the_load_check_reads_the_arrivals_the_meters_counted(
        answers: dict[str, float], want: float) -> None:
    """The window's request rate (its load check against the window before, and the
    summary's ``request_rate``) read finished + queue growth + turned away on vLLM too,
    where the requests whose clients gave up are in none of them: a load that grew into
    timeouts read as the same load."""
    assert _windows(answers).request_rate(0.0, 300.0, canary=False) == pytest.approx(want)


def test_no_data_at_all_is_no_rate() -> None:
    import math

    assert math.isnan(_windows({}).request_rate(0.0, 300.0, canary=False))


@pytest.mark.prometheus
def test_prometheus_reads_the_window_rate_from_the_meters_count_where_there_is_one(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Replica a's meter counts 1 request a second, of which its vLLM finished 0.5 (the
    rest gave up); replica b has no meter: 2 finished a second, 0.1 turned away, its
    queue 20 longer over the 5 minutes."""
    series: list[dict[str, str]] = []

    def add(name: str, values: str, **labels: str) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in {"d": "x", **labels}.items())
        series.append({"series": f"{name}{{{text}}}", "values": values})

    add(ARRIVALS, "0+60x10", instance="a", priority_class="p0", model_name="m")
    add("vllm:e2e_request_latency_seconds_count", "0+30x10", instance="a",
        priority_class="p0")
    add("vllm:e2e_request_latency_seconds_count", "0+120x10", instance="b",
        priority_class="p1")
    add(REFUSED, "0+6x10", instance="b", priority_class="p1")
    add("vllm:num_requests_running", "0+1x10", instance="b")
    add("vllm:num_requests_waiting", "0+3x10", instance="b")
    q = {k: v[None] for k, v in _windows({})._exprs({"d": "x"}, 300).items()
         if k in ("arrival_rate", "request_rate")}
    _promtool(prometheus_binaries, tmp_path, series, q, {
        "arrival_rate": [("{}", 1.0)], "request_rate": [("{}", 2.0 + 0.1 + 20 / 300)]})


@pytest.mark.prometheus
def test_prometheus_takes_each_replicas_invalid_requests_off_the_window_rate(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The window's rate of the metered replicas' arrivals: a's 1/3 a second, e's none
    (not -0.1), f's 0.5."""
    q = _windows({})._exprs({"d": "x"}, 300)["arrival_rate"][None]
    _promtool(prometheus_binaries, tmp_path, _flooded(), {"arrival_rate": q},
              {"arrival_rate": [("{}", 1 / 3 + 0.5)]})
