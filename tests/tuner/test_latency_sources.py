"""Where the rules read a backend's TTFT and TBT: the engine's own histograms, or, on a
vLLM deployment, the meter's client-side ones wherever it observed a stream in the
window (vLLM's own leave out its frontend's work and read low), else vLLM's.

Evaluated by the real Prometheus engine (promtool's rule unit tests) on series laid out
here: the P99 and P50 each rule records, per window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.meter.client_latency import CLIENT_SERIES, CLIENT_TBT, CLIENT_TTFT
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.alert_table import Figure
from slopilot.tuner.prometheus.latency_sources import BUILTIN_LATENCY, VLLM_LATENCY
from slopilot.tuner.prometheus.rules import (
    EXAMPLE_DCGM_NAMESPACE,
    EXAMPLE_DEPLOYMENT,
    EXAMPLE_HEADER,
    example_path,
    example_spec,
    render_rule_groups,
    render_rules_yaml,
)
from tests.support.fixtures import prometheus_binaries  # noqa: F401
from tests.support.prometheus import PrometheusBinaries, promtool

TTFT, TBT = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
LABELS = 'slopilot_namespace="n",slopilot_deployment="d",priority_class="p0"'
SCALE = 100_000
"""The figures compared in hundred-thousandths of a second (promtool prints rounded
floats); every expected one below is a whole number of them."""

# 10 observations a minute, all in one bucket: a quantile q reads lo + (hi - lo) * q.
# vLLM's edges for its own, the engine's for the meter's.
VLLM_SERIES = {TTFT: ("0.08", "0.1"), TBT: ("0.01", "0.025")}
METER_SERIES = {CLIENT_TTFT: ("0.2", "0.3"), CLIENT_TBT: ("0.03", "0.04")}
# record -> (vLLM's figure, the meter's figure), in seconds. vLLM's TBT P99s: P0's
# 20 ms SLO lies inside (10, 25] ms, whose observations a P99 spreads over (10, 20] ms
# (``rules.judged_buckets``: no breach the buckets cannot prove), 10 + 10 x 0.99 ms;
# so does a P50 (every quantile is read on the same buckets), 10 + 10 x 0.5 ms.
FIGURES = {
    "slopilot:ttft_seconds:p99": (0.0998, 0.299),
    "slopilot:ttft_seconds:p50": (0.09, 0.25),
    "slopilot:tbt_seconds:p99": (0.0199, 0.0399),
    "slopilot:tbt_seconds:p50": (0.015, 0.035),
    Figure.TTFT_P99_LONG.value: (0.0998, 0.299),
    Figure.TBT_P99_LONG.value: (0.0199, 0.0399),
}
LONG = {Figure.TTFT_P99_LONG.value, Figure.TBT_P99_LONG.value}


def _series(metric: str, edges: tuple[str, str], values: str) -> list[dict[str, str]]:
    lo, hi = edges
    out = [{"series": f'{metric}_bucket{{{LABELS},le="{lo}"}}', "values": "0+0x10"}]
    out += [{"series": f'{metric}_bucket{{{LABELS},le="{le}"}}', "values": values}
            for le in (hi, "+Inf")]
    out.append({"series": f"{metric}_count{{{LABELS}}}", "values": values})
    return out


def assert_rules_test(binaries: PrometheusBinaries, where: Path, series: list[Any],
                      exprs: list[dict[str, Any]]) -> None:
    """promtool's unit test of ``where/rules.yaml`` on ``series``, every expression as
    expected, one minute a sample."""
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "promql_expr_test": exprs}]}
    (where / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=where)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
@pytest.mark.parametrize(("meter", "eval_time", "reads"), [
    ("observing", "5m", {r: "meter" for r in FIGURES}),
    # A meter that saw no stream in the window (clients that ask for bodies): vLLM's.
    ("idle", "5m", {r: "vllm" for r in FIGURES}),
    ("absent", "5m", {r: "vllm" for r in FIGURES}),
    # Streams until minute 3, none after: the last minute reads vLLM's, the sustained
    # rows' five minutes the meter's.
    ("idle-lately", "6m", {r: "meter" if r in LONG else "vllm" for r in FIGURES}),
])

def test_vllm_latency_is_the_meters_where_it_saw_a_stream_else_vllms(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        meter: str, eval_time: str, reads: dict[str, str]) -> None:
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(
        SLOSpec.from_profile("standard"), "d", namespace="n", latency=VLLM_LATENCY))
    series = [s for metric, edges in VLLM_SERIES.items()
              for s in _series(metric, edges, "0+10x10")]
    meter_values = {"observing": "0+10x10", "idle": "7+0x10",
                    "idle-lately": "0+10x3 30+0x6"}.get(meter)
    if meter_values is not None:
        series += [s for metric, edges in METER_SERIES.items()
                   for s in _series(metric, edges, meter_values)]
    exprs = [{"expr": f"round({record} * {SCALE})", "eval_time": eval_time,
              "exp_samples": [{"labels": f"{{{LABELS}}}",
                               "value": round(FIGURES[record][reads[record] == "meter"]
                                              * SCALE)}]}
             for record in FIGURES]
    assert_rules_test(prometheus_binaries, tmp_path, series, exprs)


def test_the_builtin_engines_rules_are_the_checked_in_rendering() -> None:
    """The built-in engine observes TTFT and TBT at its own writes: its rules read its
    histograms alone, byte for byte as before the meter had any."""
    checked_in = example_path().read_text()
    assert checked_in == EXAMPLE_HEADER + render_rules_yaml(
        example_spec(), EXAMPLE_DEPLOYMENT, latency=BUILTIN_LATENCY,
        dcgm_namespace=EXAMPLE_DCGM_NAMESPACE)
    assert not any(name in checked_in for name in CLIENT_SERIES)
    for profile in ("strict", "standard", "relaxed"):
        spec = SLOSpec.from_profile(profile)
        assert render_rule_groups(spec, "d", namespace="n") == render_rule_groups(
            spec, "d", namespace="n", latency=BUILTIN_LATENCY)


def test_vllms_goodput_approximation_stays_on_vllms_histograms() -> None:
    """Read only for a replica that judged nothing, whose meter then saw no stream: its
    client-side histograms are empty there, vLLM's are not."""
    rules: list[dict[str, Any]] = render_rule_groups(
        SLOSpec.from_profile("standard"), "d", namespace="n",
        latency=VLLM_LATENCY)["groups"][0]["rules"]
    goodput = {r["labels"]["priority_class"]: r["expr"] for r in rules
               if r.get("record") == "slopilot:goodput_tokens:per_second"}
    assert TBT in goodput["p0"] and TTFT in goodput["p0"]
    assert not any(n in e for e in goodput.values() for n in CLIENT_SERIES)
    p99 = next(r["expr"] for r in rules if r.get("record") == "slopilot:tbt_seconds:p99")
    assert CLIENT_TBT in p99 and TBT in p99


@pytest.mark.prometheus
@pytest.mark.parametrize("meter", ["observing", "idle"])
def test_the_windows_p99_of_every_class_together_reads_the_same_source(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        meter: str) -> None:
    """A trial window's P99 over every class (status.ttftP99Ms) sums by ``le`` alone:
    the guard then holds for the deployment as a whole."""
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    windows = PrometheusWindows(lambda expr, at: [], {"slopilot_deployment": "d"},
                                SLOSpec.from_profile("standard"), latency=VLLM_LATENCY)
    exprs = windows._exprs({"slopilot_deployment": "d"}, 60)
    series = [s for metric, edges in VLLM_SERIES.items()
              for s in _series(metric, edges, "0+10x10")]
    series += [s for metric, edges in METER_SERIES.items()
               for s in _series(metric, edges, "0+10x10" if meter == "observing"
                                else "7+0x10")]
    # Read at every class's thresholds, as each class's own: P0's 20 ms TBT SLO inside
    # vLLM's (10, 25] ms, 10 + 10 x 0.99 ms (``rules.judged_buckets``).
    overall = FIGURES
    tests = [{"expr": f"round(({exprs[key + '_p99_all'][None]}) * {SCALE})",
              "eval_time": "5m",
              "exp_samples": [{"labels": "{}", "value": round(
                  overall[record][meter == "observing"] * SCALE)}]}
             for key, record in (("ttft", "slopilot:ttft_seconds:p99"),
                                 ("tbt", "slopilot:tbt_seconds:p99"))]
    assert_rules_test(prometheus_binaries, tmp_path, series, tests)


def test_every_vllm_latency_edge_up_to_the_refused_ttft_is_a_builtin_edge() -> None:
    """A query written for vLLM on its edges (an attainment read as ``le="0.25"``, a TBT
    of ``le="0.025"``) read no series on the built-in engine, whose edges lacked them."""
    from slopilot.engine.sim.stats import REFUSED_TTFT_S
    from slopilot.tuner.prometheus.latency_sources import BUILTIN_LATENCY, VLLM_LATENCY_BUCKETS

    for metric, edges in VLLM_LATENCY_BUCKETS.items():
        builtin = BUILTIN_LATENCY.edges(metric)
        assert builtin[-1] == REFUSED_TTFT_S == 300.0
        missing = [e for e in edges if e <= REFUSED_TTFT_S and e not in builtin]
        assert missing == [], metric


def _probes_count(window_s: int) -> str:
    """What the workload probe of a vLLM deployment asks for its ``timed_rates``."""
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.prometheus.adapters import PrometheusProbe

    asked: list[str] = []

    def query(expr: str, at: float | None) -> list[dict[str, Any]]:
        asked.append(expr)
        return [{"metric": {"priority_class": "p0"}, "value": [at, "6"]}]

    probe = PrometheusProbe(query, {"slopilot_deployment": "d"}, load_scenario("tiny-cpu"),
                            window_s=window_s, latency=VLLM_LATENCY)
    assert probe.timed_rates(300.0) == {"p0": 6 / window_s}
    (expr,) = asked
    return expr


def test_the_probe_times_nothing_apart_on_the_builtin_engine() -> None:
    """Its own histograms time every request: the hold reads the probe's arrivals."""
    from slopilot.engine.sim.scenario import load_scenario
    from slopilot.tuner.prometheus.adapters import PrometheusProbe

    def query(expr: str, at: float | None) -> list[dict[str, Any]]:
        raise AssertionError(f"no query expected: {expr}")

    probe = PrometheusProbe(query, {"slopilot_deployment": "d"}, load_scenario("tiny-cpu"),
                            window_s=120, latency=BUILTIN_LATENCY)
    assert probe.timed_rates(300.0) is None


@pytest.mark.prometheus
@pytest.mark.parametrize("reader", ["window", "probe"])
@pytest.mark.parametrize(("meter", "count"), [("observing", 3), ("idle", 10)])
def test_a_windows_ttft_samples_count_the_histogram_its_p99_reads(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        meter: str, count: int, reader: str) -> None:
    """10 requests a minute finish, 3 of them streamed: the P99 is the meter's, of 3. The
    probe's count, that the thin-traffic hold reads before a first trial, is the same:
    read off the arrivals (10), it let through a class whose trials could not reach the
    floor."""
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    windows = PrometheusWindows(lambda expr, at: [], {"slopilot_deployment": "d"},
                                SLOSpec.from_profile("standard"), latency=VLLM_LATENCY)
    expr = windows._exprs({"slopilot_deployment": "d"}, 120)["ttft_samples"][None] \
        if reader == "window" else _probes_count(120)
    series = [s for metric, edges in VLLM_SERIES.items()
              for s in _series(metric, edges, "0+10x10")]
    series += [s for metric, edges in METER_SERIES.items()
               for s in _series(metric, edges, "0+3x10" if meter == "observing"
                                else "7+0x10")]
    tests = [{"expr": f"round(({expr}) / 2)", "eval_time": "5m",
              "exp_samples": [{"labels": '{priority_class="p0"}', "value": count}]}]
    assert_rules_test(prometheus_binaries, tmp_path, series, tests)
