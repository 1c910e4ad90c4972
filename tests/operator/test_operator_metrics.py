"""The operator serves its controllers' series: what the dashboards' Tuning and Twin rows read.

``slopilot_tuner_*``, ``slopilot_replicas`` and ``slopilot_twin_*`` are recorded in the
operator process, not in the engines, so no ServiceMonitor of an LLMDeployment scrapes
them: without an endpoint of the operator's own, those panels stay empty.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest
import yaml

from slopilot.operator.daemon import operator_metrics
from slopilot.operator.metrics_endpoint import metrics_address, serve_metrics
from slopilot.tuner.loop.state import ControllerState
from tests.operator.test_operator_metrics_size import PER_CR
from tests.support.waits import HANG_GUARD_S

MANIFESTS = Path(__file__).parents[2] / "manifests"


def test_the_controllers_series_are_served() -> None:
    operator_metrics("team-m").observe("served", ControllerState.SCALING, 3)
    server = serve_metrics(("127.0.0.1", 0))
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics",
                         timeout=HANG_GUARD_S).text
    finally:
        server.close()
    assert 'slopilot_replicas{slopilot_deployment="served",slopilot_namespace="team-m"} 3.0' \
        in text
    operator_metrics("team-m").forget("served")


@pytest.mark.parametrize(("text", "address"), [
    ("0.0.0.0:8081", ("0.0.0.0", 8081)), ("127.0.0.1:9", ("127.0.0.1", 9)),
    ("[::]:8081", ("::", 8081))])
def test_an_address_is_host_and_port(text: str, address: tuple[str, int]) -> None:
    assert metrics_address(text) == address


@pytest.mark.parametrize("text", ["8081", "host:", ":8081x", "0.0.0.0:70000",
                                  "http://0.0.0.0:8081/metrics", "a b:1", "0.0.0.0:-1"])
def test_a_bad_address_names_the_option(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"--metrics"):
        metrics_address(text)


def test_the_manifest_serves_and_announces_the_endpoint() -> None:
    docs = list(yaml.safe_load_all((MANIFESTS / "operator.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert "--metrics=0.0.0.0:8081" in container["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    monitor = yaml.safe_load((MANIFESTS / "monitoring" / "operator-podmonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    # The series carry slopilot_namespace / slopilot_deployment of their own; the
    # scrape must keep them, not relabel them as the operator pod's.
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert monitor["spec"]["selector"]["matchLabels"].items() \
        <= pod["metadata"]["labels"].items()


def test_the_podmonitors_suggested_sample_limit_is_a_spec_field_once_uncommented() -> None:
    """The PodMonitor's own limit is ``spec.sampleLimit`` (prometheus-operator's
    PodMonitorSpec); the suggestion sat on the endpoint, where an administrator who
    uncommented it set no limit at all (or had the apply refused)."""
    text = (MANIFESTS / "monitoring" / "operator-podmonitor.yaml").read_text()
    assert text.count("# sampleLimit:") == 1
    monitor = yaml.safe_load(text.replace("# sampleLimit:", "sampleLimit:"))
    # Sized for 1,000 CRs at the per-CR bound the size test proves.
    assert monitor["spec"]["sampleLimit"] == PER_CR * 1000
    assert f"at most {PER_CR} samples per tuning CR" in text
    assert all("sampleLimit" not in e for e in monitor["spec"]["podMetricsEndpoints"])
