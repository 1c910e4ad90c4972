"""On vLLM's own histograms a P99 verdict claims no breach the buckets cannot prove.

Where the meter saw no stream (clients that ask for bodies), a vLLM deployment's P99s are
read from vLLM's histograms, whose edges the standard profile's thresholds fall between:
P0's TBT SLO (20 ms) inside (10, 25] ms, twice it (40 ms) inside (25, 50] ms, twice its
TTFT SLO (200 ms) inside (100, 250] ms. ``histogram_quantile`` spreads a bucket's
observations evenly over it, so every gap at 12 ms read a P99 of 24.85 ms (retune) and
every gap at 30 ms 49.75 ms (the critical ``scale``), whatever they were. A verdict there
now reads "P99 above T" as "more than 1 % of the observations above the first edge at
or above T": a breach past that edge still fires, one inside the bucket does not.

And a vLLM replica counts as stalled only while its meter has requests in flight: vLLM
may keep its running and waiting gauges from its last step after every request was
aborted (vllm-project/vllm#22545, #29928), an idle pod read as stuck.

The operator's own rules (``desired_objects`` for the vLLM sample) under promtool, on
series with vLLM's edges (``VLLM_LATENCY_BUCKETS``) and labels.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from slopilot.engine.histogram_quantiles import judged_quantile
from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.meter.client_latency import CLIENT_ABANDONED, CLIENT_TBT, CLIENT_TTFT
from slopilot.engine.meter.exposition import IN_FLIGHT
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.alert_table import RuleOptions, latency_thresholds
from slopilot.tuner.prometheus.latency_sources import TBT, TTFT, VLLM_LATENCY_BUCKETS
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool
from tests.tuner.test_stall_alerts import STALLED, ident, labels, rules_file, run

N = 40
"""Samples, 15 s apart: 10 minutes."""
P0 = {"priority_class": "p0"}


def histogram(name: str, edges: tuple[float, ...] | list[float], value: float,
              per_step: float) -> list[dict[str, str]]:
    """``name``'s series where every observation is ``value``, ``per_step`` each 15 s."""
    out = []
    for edge in [*edges, float("inf")]:
        le = "+Inf" if edge == float("inf") else floatToGoString(edge)
        inc = per_step if value <= edge else 0
        out.append({"series": f"{name}_bucket{labels(le=le, **P0)}",
                    "values": f"0+{inc}x{N}"})
    out.append({"series": f"{name}_count{labels(**P0)}", "values": f"0+{per_step}x{N}"})
    out.append({"series": f"{name}_sum{labels(**P0)}",
                "values": f"0+{per_step * value}x{N}"})
    return out


def meter_saw_no_stream() -> list[dict[str, str]]:
    """The meter's families as it exports them before its first stream: at 0."""
    out = []
    for name in (CLIENT_TTFT, CLIENT_TBT):
        out += histogram(name, TOKEN_LATENCY_BUCKETS, 1.0, 0)
    out.append({"series": f"{CLIENT_ABANDONED}{labels(within_ttft_target='false', **P0)}",
                "values": f"0x{N}"})
    return out


def bodies_only(gap_s: float, ttft_s: float, finished: float = 10) -> list[dict[str, str]]:
    """A busy vLLM replica whose clients ask for bodies: every token gap ``gap_s``, every
    first token ``ttft_s`` (``finished`` requests each 15 s, 100 tokens each)."""
    return [
        *meter_saw_no_stream(),
        *histogram(TBT, VLLM_LATENCY_BUCKETS[TBT], gap_s, 400),
        *histogram(TTFT, VLLM_LATENCY_BUCKETS[TTFT], ttft_s, finished),
        *histogram("vllm:request_generation_tokens", (10, 100, 1000), 100, finished),
        {"series": f"vllm:num_requests_running{labels()}", "values": f"8x{N}"},
        {"series": f"vllm:num_requests_waiting{labels()}", "values": f"0x{N}"},
        {"series": f"vllm:generation_tokens_total{labels()}", "values": f"0+3000x{N}"},
        {"series": f"up{labels()}", "values": f"1x{N}"},
    ]


def alert(severity: str, action: str) -> dict[str, Any]:
    return {"exp_labels": {"severity": severity, "action": action, "priority_class": "p0",
                           **ident()}}


def check(name: str, *expected: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": "9m", "alertname": name, "exp_alerts": list(expected)}


def figure(expr: str, value: float | None) -> dict[str, Any]:
    """``expr`` of P0 at 9m: ``value``, or no sample for None."""
    series = expr.split("{")[0].split("(")[-1]
    own = ",".join(f'{k}="{v}"' for k, v in ident(priority_class="p0").items())
    samples = [] if value is None else [{"labels": f"{{{own}}}" if "(" in expr
                                         else f"{series}{{{own}}}", "value": value}]
    return {"expr": expr, "eval_time": "9m", "exp_samples": samples}


def vllm_rules(tmp_path: Path, slo: dict[str, Any] | None = None) -> list[str]:
    return [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                       slo or {"profile": "standard", "vllmClass": "p0"})]


@pytest.mark.prometheus
def test_gaps_inside_the_bucket_holding_the_slo_claim_no_breach(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every gap 12 ms (SLO 20 ms), in (10, 25] ms: the buckets cannot say it is over the
    # SLO (it is not), so neither TBT alert fires and the P99 reads at most the SLO.
    checks = [check("SlopilotTBTP99Sustained"), check("SlopilotTBTP99High")]
    exprs = [figure('slopilot:tbt_seconds:p99_long{priority_class="p0"} > 0.02', None),
             figure('slopilot:tbt_seconds:p99{priority_class="p0"} > 0.02', None)]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), bodies_only(0.012, 0.05),
        checks, exprs)


@pytest.mark.prometheus
def test_gaps_inside_the_bucket_holding_twice_the_slo_do_not_scale(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every gap 30 ms, in (25, 50] ms: past the 25 ms edge, so over the 20 ms SLO for
    # sure (the sustained retune fires); twice it (40 ms) the buckets cannot prove, so
    # the critical scale does not.
    checks = [check("SlopilotTBTP99High"),
              check("SlopilotTBTP99Sustained", alert("warning", "retune"))]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), bodies_only(0.030, 0.05),
        checks, [figure('slopilot:tbt_seconds:p99{priority_class="p0"} > 0.04', None)])


@pytest.mark.prometheus
def test_gaps_past_the_edge_above_twice_the_slo_still_scale(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every gap 60 ms, past the 50 ms edge above 40 ms: a breach the buckets prove.
    checks = [check("SlopilotTBTP99High", alert("critical", "scale"))]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), bodies_only(0.060, 0.05),
        checks)


@pytest.mark.prometheus
def test_first_tokens_inside_the_bucket_holding_twice_the_slo_only_warn(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every first token 150 ms (SLO 100 ms, an edge of vLLM's; 2 x = 200 ms inside
    # (100, 250] ms): over the SLO for sure (the warning fires), over twice it not.
    checks = [check("SlopilotTTFTP99High", alert("warning", "inform"))]
    exprs = [figure('slopilot:ttft_seconds:p99{priority_class="p0"} > 0.2', None)]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), bodies_only(0.012, 0.15),
        checks, exprs)


@pytest.mark.prometheus
def test_goodput_counts_gaps_inside_the_bucket_holding_the_slo_as_met(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every gap 12 ms and every first token 50 ms, within their SLOs: all 100 tokens of
    # each request finished are good, 10 x 100 / 15 s. Spread evenly over (10, 25] ms the
    # gaps read a third over 20 ms, and the goodput a third low.
    exprs = [figure('round(slopilot:goodput_tokens:per_second{priority_class="p0"}, 0.001)',
                    round(1000 / 15, 3))]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), bodies_only(0.012, 0.05),
        [], exprs)


def idle_after_mass_abort(in_flight: int | None) -> list[dict[str, str]]:
    """vLLM after every request was aborted at once: its gauges keep their last step's
    106 running and 15 waiting, no token is made; the meter has ``in_flight`` requests
    forwarded and unanswered (None: a meter from before the gauge)."""
    series = [*meter_saw_no_stream(),
              {"series": f"vllm:num_requests_running{labels()}", "values": f"106x{N}"},
              {"series": f"vllm:num_requests_waiting{labels()}", "values": f"15x{N}"},
              {"series": f"vllm:generation_tokens_total{labels()}", "values": f"50000x{N}"},
              {"series": f"up{labels()}", "values": f"1x{N}"}]
    if in_flight is not None:
        series.append({"series": f"{IN_FLIGHT}{labels(**P0)}", "values": f"{in_flight}x{N}"})
    return series


@pytest.mark.prometheus
@pytest.mark.parametrize("in_flight", [0, None])
def test_vllms_stale_gauges_without_requests_in_flight_at_the_meter_are_no_stall(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        in_flight: int | None) -> None:
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), idle_after_mass_abort(in_flight),
        [check("SlopilotEngineStalled")])


@pytest.mark.prometheus
def test_a_vllm_replica_with_requests_in_flight_at_the_meter_and_no_token_is_stalled(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), idle_after_mass_abort(3),
        [check("SlopilotEngineStalled", STALLED)])


def stuck_vllm(in_flight: str, tokens: str) -> list[dict[str, str]]:
    """vLLM's gauges stuck at 8 running, 400 waiting; its token counter ``tokens`` and the
    meter's requests in flight ``in_flight`` (promtool's value text, 15 s a sample)."""
    return [*meter_saw_no_stream(),
            {"series": f"vllm:num_requests_running{labels()}", "values": f"8x{2 * N}"},
            {"series": f"vllm:num_requests_waiting{labels()}", "values": f"400x{2 * N}"},
            {"series": f"vllm:generation_tokens_total{labels()}", "values": tokens},
            {"series": f"{IN_FLIGHT}{labels(**P0)}", "values": in_flight},
            {"series": f"up{labels()}", "values": f"1x{2 * N}"}]


@pytest.mark.prometheus
@pytest.mark.parametrize("pattern", ["0 1 1 1", "1 1 0 0 0 0 0 0"])
def test_a_vllm_stall_at_sparse_traffic_fires_though_no_client_waits_at_some_scrapes(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        pattern: str) -> None:
    """A stuck vLLM whose clients come every 2 minutes and give up after 30 s: at most
    scrapes the meter has none in flight, and the alert read only the instant's count, so
    its ``for`` began again at each and never held (a review: at none of 10, 12.5, 15,
    19 minutes). Requests in flight within the stall lookback, with no token made over
    it, count; the alert fires once the tokens have been flat that long."""
    flap = " ".join((pattern.split() * 200)[:2 * N + 1])
    series = stuck_vllm(flap, f"0+6000x10 60000x{2 * N - 10}")
    checks = [{"eval_time": at, "alertname": "SlopilotEngineStalled", "exp_alerts": [STALLED]}
              for at in ("12m30s", "15m", "19m")]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), series, checks)


@pytest.mark.prometheus
def test_vllm_idle_after_a_mass_abort_never_reads_as_stalled(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Every request aborted at 2.5 minutes: the meter's count falls to 0 then, vLLM's
    gauges stay at their last step's and its tokens stop. Requests were in flight within
    the lookback, but tokens were made within it too, until the lookback holds neither."""
    series = stuck_vllm(f"3x10 0x{2 * N - 10}", f"0+6000x10 60000x{2 * N - 10}")
    checks = [{"eval_time": at, "alertname": "SlopilotEngineStalled", "exp_alerts": []}
              for at in ("4m", "6m", "7m30s", "9m", "12m", "19m")]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), series, checks)


@pytest.mark.prometheus
def test_an_exported_edge_at_a_threshold_is_read_as_it_is(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Another vLLM release (or a meter image) exporting an edge at P0's 2 x TTFT, 0.2 s:
    the judged copy of the bucket holding the threshold was made of every bucket of the
    class, and renamed onto le="0.2" beside the exported one, two series of one label
    set: Prometheus refused the rule, and P0 read no P99 at all. Each copy now holds
    the one bucket it renames, and an exported edge is kept as it is."""
    series = [*meter_saw_no_stream(),
              {"series": f"{TTFT}_count{labels(**P0)}", "values": f"0+60x{N}"}]
    for le in ("0.1", "0.2", "0.25", "0.5", "2560.0", "+Inf"):
        series.append({"series": f"{TTFT}_bucket{labels(le=le, **P0)}",
                       "values": f"0x{N}" if le == "0.1" else f"0+60x{N}"})
    # Every first token in (0.1, 0.2]: 0.1 + 0.99 x 0.1 from the exported edges.
    exprs = [figure('round(slopilot:ttft_seconds:p99{priority_class="p0"}, 0.0001)', 0.199)]
    run(prometheus_binaries, tmp_path, vllm_rules(tmp_path), series, [], exprs)


def spread(edges: tuple[float, ...], seed: int, near: range) -> list[int]:
    """Observations per 15 s in each bucket of ``edges`` (and +Inf): a few of the
    buckets ``near`` (P0's thresholds), at random."""
    rng = random.Random(seed)
    counts = [0] * (len(edges) + 1)
    for _ in range(rng.randint(1, 4)):
        counts[rng.choice(near)] += rng.randint(1, 200)
    return counts


@pytest.mark.prometheus
def test_the_rules_p99s_are_the_direct_scrapes(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The P99s the rules record on vLLM's own buckets (the meter idle) equal what the
    Python twin of the rules (``judged_quantile``, under the same thresholds from the
    alert table) reads from the same buckets, for buckets filled at random."""
    spec = SLOSpec.from_dict({"profile": "standard"})
    tests = []
    for seed in range(12):
        series, exprs = meter_saw_no_stream(), []
        # TBT: 20 ms inside (10, 25], 40 inside (25, 50]; TTFT: 100 ms an edge, 200
        # inside (100, 250].
        for metric, figure_name, ttft, near in (
                (TBT, "slopilot:tbt_seconds:p99", False, range(0, 5)),
                (TTFT, "slopilot:ttft_seconds:p99", True, range(6, 11))):
            edges = tuple(VLLM_LATENCY_BUCKETS[metric])
            counts = spread(edges, seed * 2 + ttft, near)
            cumulative, total = {}, 0
            for edge, n in zip([*edges, math.inf], counts, strict=True):
                total += n
                cumulative[edge] = float(total)
                le = "+Inf" if edge == math.inf else floatToGoString(edge)
                series.append({"series": f"{metric}_bucket{labels(le=le, **P0)}",
                               "values": f"0+{total}x{N}"})
            series.append({"series": f"{metric}_count{labels(**P0)}",
                           "values": f"0+{total}x{N}"})
            limits = latency_thresholds(spec, RuleOptions(), ttft=ttft)["p0"]
            expected = judged_quantile(0.99, cumulative, limits)
            exprs.append(figure(f'round({figure_name}{{priority_class="p0"}}, 0.000001)',
                                round(expected, 6)))
        tests.append({"interval": "15s", "input_series": series, "promql_expr_test": exprs})
    files = vllm_rules(tmp_path, {"profile": "standard", "vllmClass": "p0"})
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(
        {"rule_files": files, "evaluation_interval": "30s", "tests": tests}))
    result = promtool(prometheus_binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
