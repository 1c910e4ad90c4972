"""Hand-made ``WindowSummary`` objects for tests of what reads them (objective, alerts,
controller): only the figures a test cares about, plausible defaults for the rest; and
summary dicts as earlier versions stored them in Optuna studies."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import ClassFigures, RunInfo, WindowSummary

# What the previous version's PrometheusWindows stored in a trial's user attributes (read
# back by Optuna's JSON decoder, which takes NaN): an idle class's P99s and an unknown
# request rate as NaN, per-class figures without slo_attainment.
OLD_PROMETHEUS = json.loads("""{"duration_s": 10.0, "requests_finished": 10.5,
 "throughput_tok_s": 110.0, "goodput_tok_s": 95.0, "ttft_p99_ms": 400.0,
 "tbt_p99_ms": 50.0, "preemptions_per_min": 0.0, "start": 90.0, "end": 100.0,
 "canary": false, "request_rate": NaN, "elapsed_s": 10.2, "classes": {
 "p0": {"requests_finished": 3.0, "ttft_p99_ms": 200.0, "tbt_p99_ms": 20.0,
        "throughput_tok_s": 30.0, "goodput_tok_s": 25.0, "preemptions_per_min": 0.0},
 "p1": {"requests_finished": 7.5, "ttft_p99_ms": 400.0, "tbt_p99_ms": 50.0,
        "throughput_tok_s": 80.0, "goodput_tok_s": 70.0, "preemptions_per_min": 0.0},
 "p2": {"requests_finished": 0.0, "ttft_p99_ms": NaN, "tbt_p99_ms": NaN,
        "throughput_tok_s": 0.0, "goodput_tok_s": 0.0, "preemptions_per_min": 0.0}}}""")
# The previous SimCluster.summary: no overall P99s, a per-class slo_met since dropped.
OLD_CLUSTER = {
    "duration_s": 10, "replicas": 1, "requests_finished": 7, "request_rate": 2.4,
    "goodput_tok_s": 107.9, "throughput_tok_s": 108.2, "preemptions_per_min": 0.0,
    "busy_ratio": 0.70, "classes": {
        "p0": {"requests_finished": 1, "slo_met": 1, "slo_attainment": 1.0,
               "ttft_p99_ms": 69.2, "tbt_p99_ms": 33.0, "throughput_tok_s": 6.3,
               "goodput_tok_s": 6.3},
        "p1": {"requests_finished": 6, "slo_met": 5, "slo_attainment": 5 / 6,
               "ttft_p99_ms": 139.7, "tbt_p99_ms": 79.3, "throughput_tok_s": 101.9,
               "goodput_tok_s": 101.6},
        "p2": {"requests_finished": 0, "slo_met": 0, "slo_attainment": None,
               "ttft_p99_ms": None, "tbt_p99_ms": None, "throughput_tok_s": 0.0,
               "goodput_tok_s": 0.0}}}


def figures(ttft: float | None = None, tbt: float | None = None, goodput: float = 0.0,
            finished: float = 10, throughput: float | None = None) -> ClassFigures:
    """One class: P99s in ms (None: no samples), goodput and throughput in tokens/s."""
    return ClassFigures(requests_finished=finished,
                        throughput_tok_s=goodput if throughput is None else throughput,
                        goodput_tok_s=goodput, ttft_p99_ms=ttft, tbt_p99_ms=tbt)


def window(classes: Mapping[str, ClassFigures] | None = None, *, preemptions: float = 0.0,
           duration_s: float = 60.0, config: Mapping[str, Any] | None = None
           ) -> WindowSummary:
    """A summary of ``classes`` by label (absent ones served nothing); the overall figures
    are their sums, its P99s the worst class's (a stand-in: tests here read per class)."""
    per = {p: (classes or {}).get(p.label, figures(finished=0)) for p in Priority}

    def worst(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    overall = ClassFigures(
        requests_finished=sum(c.requests_finished for c in per.values()),
        throughput_tok_s=sum(c.throughput_tok_s for c in per.values()),
        goodput_tok_s=sum(c.goodput_tok_s for c in per.values()),
        ttft_p99_ms=worst([c.ttft_p99_ms for c in per.values()]),
        tbt_p99_ms=worst([c.tbt_p99_ms for c in per.values()]))
    run = None if config is None else RunInfo(scenario="test", config=dict(config),
                                              rejected=0, prefix_hit_rate=0.0)
    return WindowSummary(duration_s=duration_s, preemptions_per_min=preemptions,
                         overall=overall, classes=per, run=run)


_COUNTS = {"requests_finished": 0.0, "throughput_tok_s": 0.0, "goodput_tok_s": 0.0}
_LATENCIES = {"ttft_p99_ms": None, "tbt_p99_ms": None}


def _clean(values: Mapping[str, Any]) -> dict[str, Any]:
    # Prometheus' NaN ("no samples") is None in a summary.
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


def partial_summary(figures: Mapping[str, Any]) -> WindowSummary:
    """A WindowSummary holding ``figures`` (the dict form's keys), every other count zero
    and every other latency absent."""
    classes = figures.get("classes") or {}
    data: dict[str, Any] = {**_COUNTS, **_LATENCIES, "duration_s": 60.0,
                            "preemptions_per_min": 0.0,
                            **_clean({k: v for k, v in figures.items() if k != "classes"})}
    if data["preemptions_per_min"] is None:
        # As the live builder reads it (prometheus/query.window_summary): no series, none.
        data["preemptions_per_min"] = 0.0
    data["classes"] = {p.label: {**_COUNTS, **_LATENCIES,
                                 **_clean(classes.get(p.label) or {})} for p in Priority}
    return WindowSummary.from_dict(data)
