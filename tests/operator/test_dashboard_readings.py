"""What the dashboard's panels say a reading means, and whose each line is.

A TTFT P99 of 300 s is the histogram's last finite edge: the requests refused (429) or
whose client left after waiting past the target, not a five-minute wait. The share within
the SLO counts refusals as misses, and a class without an objective has none to meet. With
several deployments chosen, a line per replica or deployment names which one it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.dashboards import build_dashboard
from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, VLLM_LATENCY, LatencySources
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries

WHOSE = "{{slopilot_namespace}}/{{slopilot_deployment}}"
BACKENDS = pytest.mark.parametrize("latency", [BUILTIN_LATENCY, VLLM_LATENCY],
                                   ids=["builtin", "vllm"])


def _panel(latency: LatencySources, title: str) -> dict[str, Any]:
    return next(p for p in build_dashboard(latency=latency)["panels"]
                if p.get("title") == title)


@BACKENDS
def test_a_ttft_panel_says_what_300_s_means(latency: LatencySources) -> None:
    for cls in ("P0", "P1", "P2"):
        about = _panel(latency, f"TTFT {cls}")["description"]
        assert "300 s" in about and "1 %" in about and "50 %" in about
        assert "refused" in about and "past the target" in about


def test_a_vllm_ttft_panel_names_vllms_own_last_edge_too() -> None:
    # Where the meter saw no first token in the window, the panel reads vLLM's own
    # histogram, whose last finite edge is 2,560 s: a stall there reads 2,560 s, not 300.
    for cls in ("P0", "P1", "P2"):
        about = _panel(VLLM_LATENCY, f"TTFT {cls}")["description"]
        assert "2,560 s" in about and "300 s" in about
    assert "2,560" not in _panel(BUILTIN_LATENCY, "TTFT P0")["description"]


@BACKENDS
def test_the_share_within_the_slo_counts_refusals_and_draws_classes_with_objectives(
        latency: LatencySources) -> None:
    panel = _panel(latency, "Requests within their SLO")
    assert "finished requests" not in panel["description"]
    assert "429" in panel["description"] and "objective" in panel["description"]
    expr = panel["targets"][0]["expr"]
    assert "slopilot:slo_ttft_p99:seconds" in expr and "slopilot:slo_tbt_p99:seconds" in expr


@BACKENDS
def test_per_replica_and_per_deployment_lines_name_their_deployment(
        latency: LatencySources) -> None:
    titles = ["KV cache usage"] + (
        ["GPU utilization (the batching alert's input)"] if latency is VLLM_LATENCY
        else ["Busy ratio and GPU utilization (the batching alert's input)"])
    for title in titles:
        panel = _panel(latency, title)
        for target in panel["targets"]:
            assert WHOSE in target["legendFormat"], (title, target["legendFormat"])


@pytest.mark.prometheus
def test_a_latency_panel_reads_a_mixed_fleet_as_the_rules_do(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # "a" started with P0's TTFT SLO at 800 ms, "b" before it was edited; every first
    # token at 795 ms. Over the raw buckets, "a"'s 800 ms edge summed with nothing of
    # "b"'s, and the panel's P99 read 858.8 ms over the SLO line.
    from tests.tuner.test_slo_edge_verdicts import (
        AT_795,
        CUSTOM,
        ENGINE_NAMES,
        STANDARD,
        engine_exposition,
        none_over,
        rules_without_annotations,
        series_of,
    )

    series = [*series_of(engine_exposition(CUSTOM, AT_795), ENGINE_NAMES, "a"),
              *series_of(engine_exposition(STANDARD, AT_795), ENGINE_NAMES, "b")]
    exprs = [t["expr"].replace("$namespace", "n").replace("$deployment", "d")
                      .replace("$__rate_interval", "1m")
             for t in _panel(BUILTIN_LATENCY, "TTFT P0")["targets"]
             if t["legendFormat"].split(" {{")[0] in ("P99", "P50")]
    assert len(exprs) == 2
    none_over(prometheus_binaries, tmp_path, series, exprs, ["5m"],
              rules=rules_without_annotations(CUSTOM), interval="1m")
