"""A scrape target is a pod of the deployment's namespace, at its own IP, and one that
exports past the limits reads down.

A tenant (edit rights in their namespace) can make a Service with the deployment's labels
and write its Endpoints by hand: an address of another namespace's pod, which admits
Prometheus on ``http``. The operator's ServiceMonitor selects that Service too, and its
relabelings stamp the tenant's namespace and deployment on what it scrapes: the victim's
load and latency, read in the tenant's status and dashboards. Discovery labels an address
that names a pod with that pod's IP as the API server has it; the monitor keeps a target
only where the two agree (``service_monitor.pod_backed_relabelings``). Here a real
Prometheus runs the rendered relabelings, as the Prometheus Operator writes them into the
scrape job, on targets labelled as discovery labels them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.render import render_all
from slopilot.operator.spec import parse_spec
from tests.operator.test_ready_targets import (
    DOWN,
    ENDPOINTS_READY,
    POD_IP,
    as_scrape_job,
    body,
    nothing_listening,
    rules_file,
)
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.prometheus import PrometheusServer, ScrapeTarget, serve_metrics
from tests.support.waits import wait_for

UP = 'up{slopilot_namespace="team",slopilot_deployment="chat"}'


def monitor(backend: str = "vllm") -> dict[str, Any]:
    b = body(backend)
    sm: dict[str, Any] = render_all(b, parse_spec(b)).service_monitor
    return sm


def settled(prom: PrometheusServer, jobs: int) -> dict[str, Any] | None:
    """The targets once each of the ``jobs`` is discovered, kept or dropped, and each
    kept one scraped."""
    targets: dict[str, Any] = prom.get("/api/v1/targets")["data"]
    done = len(targets["activeTargets"]) + len(targets["droppedTargets"]) == jobs and all(
        t["health"] != "unknown" for t in targets["activeTargets"])
    return targets if done else None


@pytest.mark.prometheus
def test_only_an_address_that_is_its_pods_own_ip_is_scraped(
        prometheus_factory: Callable[..., PrometheusServer]) -> None:  # noqa: F811
    relabel = [as_scrape_job(r) for r in monitor()["spec"]["endpoints"][0]["relabelings"]]
    with serve_metrics(lambda: b"slopilot_busy_ratio 0.5\n") as replica, \
            serve_metrics(lambda: b"slopilot_busy_ratio 0.9\n") as victim, \
            nothing_listening() as unnamed:
        port = replica.rsplit(":", 1)[1]
        endpoints = {
            # The deployment's own pod: its address is its IP.
            "replica": (replica, {POD_IP: "127.0.0.1"}),
            # A hand-written address naming a pod of the namespace (the tenant's own,
            # whose IP is another): another namespace's pod behind it.
            "forged": (victim, {POD_IP: "10.0.0.7"}),
            # A hand-written address that names no pod.
            "no-pod": (unnamed, {}),
            # An IPv6 pod at its own IP: kept (it does not answer; it reads down).
            "ipv6": (f"[::1]:{port}", {POD_IP: "::1"})}
        prom = prometheus_factory(targets=[
            ScrapeTarget(job, [address], labels={ENDPOINTS_READY: "true", **labels},
                         relabel_configs=relabel)
            for job, (address, labels) in endpoints.items()])
        targets = wait_for(lambda: settled(prom, len(endpoints)), "every target judged",
                           diagnose=lambda: prom.log[-2000:])
        assert sorted(t["labels"]["job"] for t in targets["activeTargets"]) == \
            ["ipv6", "replica"]
        assert sorted(t["discoveredLabels"]["job"] for t in targets["droppedTargets"]) == \
            ["forged", "no-pod"]
        # The address's host, copied for the comparison, is not left on the target.
        assert not any(k.startswith("__tmp") or k == "tmp_slopilot_address_ip"
                       for t in targets["activeTargets"] for k in t["labels"])
        wait_for(lambda: len(prom.query(UP)["data"]["result"]) == 2, "up of both")
        assert {s["metric"]["job"]: s["value"][1] for s in prom.query(UP)["data"][
            "result"]} == {"replica": "1", "ipv6": "0"}


@pytest.mark.prometheus
def test_a_pod_exporting_past_the_sample_limit_reads_down_and_stores_nothing(
        prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        tmp_path: Path) -> None:
    sm = monitor()
    limit = sm["spec"]["sampleLimit"]
    relabel = [as_scrape_job(r) for r in sm["spec"]["endpoints"][0]["relabelings"]]
    flood = "".join(f'rogue_series{{i="{i}"}} 1\n' for i in range(limit + 1)).encode()
    with serve_metrics(lambda: b"slopilot_busy_ratio 0.5\n") as replica, \
            serve_metrics(lambda: flood) as rogue:
        prom = prometheus_factory(
            targets=[ScrapeTarget(job, [address], labels={ENDPOINTS_READY: "true",
                                                          POD_IP: "127.0.0.1"},
                                  relabel_configs=relabel, sample_limit=limit)
                     for job, address in (("replica", replica), ("rogue", rogue))],
            rule_files=[rules_file(tmp_path)])
        wait_for(lambda: settled(prom, 2), "both targets scraped",
                 diagnose=lambda: prom.log[-2000:])
        wait_for(lambda: len(prom.query(UP)["data"]["result"]) == 2, "up of both")
        assert {s["metric"]["job"]: s["value"][1] for s in prom.query(UP)["data"][
            "result"]} == {"replica": "1", "rogue": "0"}
        assert prom.query("count(rogue_series)")["data"]["result"] == []
        # What the loop reads: one target of the deployment down (SlopilotTargetsDown).
        wait_for(lambda: [s["value"][1] for s in prom.query(DOWN)["data"]["result"]]
                 == ["1"], "the rule's count of targets down")
