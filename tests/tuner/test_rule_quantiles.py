"""The TTFT and token-gap quantiles a user reads, against the latencies that made them.

Known latencies go through the real histograms (the built-in engine's ``EngineMetrics``;
on vLLM, the meter's ``ClientLatency``), their exposition is the input of a promtool unit
test of the real rendered rules, and promtool evaluates the recorded P50s and the P90 a
dashboard query reads (``rules.latency_quantile``, the rules' and dashboards' own text).
Each must be within ``TOLERANCE`` of the exact quantile of the latencies observed.

``histogram_quantile`` interpolates linearly inside a bucket, so a quantile is only ever
known to its bucket: a token gap held steady near 10.2 ms (a decode step) fell in
(10, 15] ms and read 12.5 ms at the P50 and 14.5 ms at the P90 (client_truth:
+12 to +34 %, docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.metric_names import REFUSED
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.latency_sources import LatencySource
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    identity_labels,
    latency_quantile,
    render_rules_yaml,
    render_selector,
)
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool

TOLERANCE = 0.10
"""The most a P50 or P90 from 1 ms to 10 s may read off the exact one, relative: the
widest bucket there (``latency_buckets.TOKEN_LATENCY_BUCKETS``)."""
NAMESPACE, DEPLOYMENT = "n", "d"
IDENTITY = identity_labels(DEPLOYMENT, NAMESPACE)


def uniform(lo_s: float, hi_s: float, n: int = 1000) -> list[float]:
    """``n`` latencies spread evenly over [lo, hi]: a steady figure with some jitter."""
    return [lo_s + (hi_s - lo_s) * (i + 0.5) / n for i in range(n)]


def lognormal(median_s: float, sigma: float, n: int = 2000) -> list[float]:
    """``n`` latencies at evenly spaced ranks of a lognormal: a queue's wide spread."""
    z = statistics.NormalDist()
    return [median_s * math.exp(sigma * z.inv_cdf((i + 0.5) / n)) for i in range(n)]


def exact(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of what was observed: the nearest rank."""
    return sorted(values)[max(math.ceil(q * len(values)) - 1, 0)]


@dataclass(frozen=True)
class Figures:
    """One class's observed first-token times and token gaps (seconds)."""

    ttft: list[float]
    tbt: list[float]


FIGURES: dict[Priority, Figures] = {
    # The client_truth phase: gaps steady near 10.2 ms, TTFTs queued.
    Priority.P0: Figures(ttft=lognormal(0.12, 0.7), tbt=uniform(0.0100, 0.0104)),
    # A bigger model's decode steps with a tail (prefills batched in), an idle server's
    # first tokens for prompts of one length.
    Priority.P1: Figures(ttft=uniform(0.041, 0.044),
                         tbt=[*uniform(0.028, 0.030, 850), *uniform(0.040, 0.048, 150)]),
    Priority.P2: Figures(ttft=lognormal(2.2, 0.3), tbt=uniform(0.120, 0.126)),
}


class _Families:
    """A collector of ready-made families, so a registry renders them as a scrape does."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def builtin_exposition(figures: dict[Priority, Figures]) -> str:
    """The built-in engine's /metrics after observing ``figures`` as its server does."""
    m = EngineMetrics("m")
    for p, f in figures.items():
        for t in f.ttft:
            m.observe_ttft(p, t)
        for g in f.tbt:
            m.observe_token_gap(p, g)
    return m.render().decode()


def meter_exposition(figures: Figures, priority: Priority) -> str:
    """A vLLM pod's meter's client-side histograms after observing ``figures``."""
    latency = ClientLatency(priority)
    for t in figures.ttft:
        latency.first_token(t)
    for g in figures.tbt:
        latency.token_gap(g)
    registry = CollectorRegistry()
    registry.register(_Families(latency.families("m")))
    return generate_latest(registry).decode()


def input_series(exposition: str, names: set[str]) -> list[dict[str, str]]:
    """promtool input series: each sample of ``names`` (histograms by base name) as a
    counter growing by its value every minute, with the labels the scrape adds."""
    series = []
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if family.name not in names and s.name not in names:
                continue
            labels = render_selector({**s.labels, **IDENTITY})
            series.append({"series": s.name + labels, "values": f"0+{s.value!r}x10"})
    return series


def off_by_more(expr: str, exact_s: float) -> str:
    """Samples only where ``expr`` reads more than ``TOLERANCE`` off ``exact_s`` (the
    sample's value is its relative error: promtool prints it) or reads nothing."""
    return f"(abs(({expr}) / {exact_s!r} - 1) > {TOLERANCE}) or absent({expr})"


def checks(latency: LatencySources, classes: Iterable[Priority],
           figures: dict[Priority, Figures]) -> list[dict[str, Any]]:
    tests = []
    for p in classes:
        sel = render_selector({**IDENTITY, "priority_class": p.label})
        for short, source, observed in (("ttft", latency.ttft, figures[p].ttft),
                                        ("tbt", latency.tbt, figures[p].tbt)):
            recorded = f"slopilot:{short}_seconds:p50{sel}"
            p90 = latency_quantile(0.9, source, sel, "1m", by="le")
            for expr, q in ((recorded, 0.5), (p90, 0.9)):
                tests.append({"expr": off_by_more(expr, exact(observed, q)),
                              "eval_time": "5m", "exp_samples": []})
    return tests


def run_promtool(binaries: PrometheusBinaries, tmp_path: Path, latency: LatencySources,
                 series: list[dict[str, str]], tests: list[dict[str, Any]]) -> None:
    rules = render_rules_yaml(SLOSpec.from_profile("standard"), DEPLOYMENT,
                              namespace=NAMESPACE, latency=latency)
    (tmp_path / "rules.yaml").write_text(rules)
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False, width=200))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _histograms(source: LatencySource) -> set[str]:
    return {h.metric for h in (source.engine, source.client) if h is not None}


@pytest.mark.prometheus
def test_builtin_engines_p50_and_p90_read_within_tolerance_of_the_exact_ones(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    names = _histograms(BUILTIN_LATENCY.ttft) | _histograms(BUILTIN_LATENCY.tbt) | {REFUSED}
    series = input_series(builtin_exposition(FIGURES), names)
    run_promtool(prometheus_binaries, tmp_path, BUILTIN_LATENCY, series,
                 checks(BUILTIN_LATENCY, Priority, FIGURES))


@pytest.mark.prometheus
@pytest.mark.parametrize("priority", list(Priority), ids=lambda p: p.label)
def test_meters_p50_and_p90_read_within_tolerance_of_the_exact_ones(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        priority: Priority) -> None:
    """On vLLM the rules read the meter's client-side histograms where it saw streams
    (one class per deployment, ``spec.slo.vllmClass``)."""
    names = {h.metric for s in (VLLM_LATENCY.ttft, VLLM_LATENCY.tbt)
             for h in (s.client,) if h is not None}
    series = input_series(meter_exposition(FIGURES[priority], priority), names)
    run_promtool(prometheus_binaries, tmp_path, VLLM_LATENCY, series,
                 checks(VLLM_LATENCY, [priority], FIGURES))
