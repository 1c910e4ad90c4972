"""Every query of the vLLM dashboard reads series a vLLM deployment has.

A vLLM pod exports vLLM's series and, beside them, the meter's (``meter_series``); the
operator's rules record theirs from those, and the controller, kube-state-metrics, DCGM
and Prometheus export the rest (``EXTERNAL_METRICS``). A panel over the built-in
engine's own ``slopilot_*`` series (its decode stalls, garbage-collector pauses, live
knobs, swapped requests, 429s) is always empty there.
"""

from __future__ import annotations

import re
from typing import Any

from slopilot.engine.meter.exposition import meter_series
from slopilot.engine.metric_names import HISTOGRAMS, REFUSED, VLLM_METRICS
from slopilot.operator.dashboards import EXTERNAL_METRICS, build_dashboard
from slopilot.tuner.prometheus.rules import VLLM_LATENCY, example_spec, render_rule_groups

_SELECTED = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")
FALLBACK = {REFUSED: "beside TTFT's buckets with an `or` to the buckets alone "
                     "(rules.bucket_rates): where no engine exports it, that reads"}


def vllm_series() -> set[str]:
    """What vLLM exports (the engine's vLLM-named series are vLLM's own names)."""
    names = set(VLLM_METRICS)
    for histogram in HISTOGRAMS & VLLM_METRICS:
        names |= {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"}
    return names


def available_on_vllm() -> set[str]:
    """vLLM's, the meter's, the external ones, and every series a vLLM deployment's
    rules record that can have a sample: a constant, or one that reads any of these."""
    have = vllm_series() | meter_series() | set(EXTERNAL_METRICS)
    rules = [r for g in render_rule_groups(example_spec(), "example", latency=VLLM_LATENCY,
                                           dcgm_namespace="gpu-operator")["groups"]
             for r in g["rules"] if "record" in r]
    grew = True
    while grew:
        grew = False
        for rule in rules:
            reads = set(_SELECTED.findall(rule["expr"]))
            if rule["record"] not in have and (not reads or reads & have):
                have.add(rule["record"])
                grew = True
    return have


def unavailable(dashboard: dict[str, Any], have: set[str]) -> list[tuple[str, str, list[str]]]:
    """(panel, legend, what it reads that vLLM has not) for every query that reads a
    series a vLLM deployment has not, a fallback alone included."""
    found = []
    queries = [(p["title"], t) for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [(f"annotation {a['name']}", a) for a in dashboard["annotations"]["list"]
                if a.get("expr")]
    for title, query in queries:
        reads = set(_SELECTED.findall(query["expr"]))
        assert reads, f"{title}: no series found in {query['expr']}"
        missing = sorted(reads - have - set(FALLBACK))
        if missing or not reads & have:
            found.append((title, query.get("legendFormat", ""), missing or sorted(reads)))
    return found


def test_every_vllm_panel_reads_series_a_vllm_deployment_has() -> None:
    have = available_on_vllm()
    assert unavailable(build_dashboard(latency=VLLM_LATENCY), have) == []


def test_the_check_finds_the_built_in_engines_own_panels() -> None:
    """Not vacuous: on the built-in engine's dashboard it names the panels that read the
    engine's own series, which a vLLM pod never exports."""
    found = {title for title, _, _ in unavailable(build_dashboard(), available_on_vllm())}
    assert {"Longest decode stall (last minute)", "Knobs over time",
            "Live configuration"} <= found, found
