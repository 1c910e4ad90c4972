"""Only ready endpoints are scraped: a pod loading its model, or rolling out, is no target.

Prometheus scrapes a Service's not-ready addresses too unless told otherwise, and every
vLLM trial rolls the pods: the new pod's meter answers 502 while vLLM loads its model, so
``up`` read 0, ``SlopilotTargetsDown`` fired after its ``for`` and its hold ended the
episode before the trial was judged, with the config restored by one more rollout. The
ServiceMonitor drops a target whose endpoint says it is not ready, as the endpoints role
labels it and as the EndpointSlice one does. Here a real Prometheus runs the relabelings
as the Prometheus Operator writes them into the scrape job, on targets labelled as each
role's discovery labels them, with the deployment's own rendered rules.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.reconcile import desired_objects
from slopilot.operator.render import render_all
from slopilot.operator.spec import parse_spec
from tests.support.fixtures import prometheus_binaries, prometheus_factory  # noqa: F401
from tests.support.prometheus import PrometheusServer, ScrapeTarget, serve_metrics
from tests.support.waits import wait_for

# What each discovery role says of an address's readiness ("true" or "false").
ENDPOINTS_READY = "__meta_kubernetes_endpoint_ready"
ENDPOINTSLICE_READY = "__meta_kubernetes_endpointslice_endpoint_conditions_ready"
DOWN = "slopilot:scrape_targets_down:count"
POD_IP = "__meta_kubernetes_pod_ip"


def body(backend: str) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u1"},
            "spec": {"backend": backend, "model": {"name": "meta-llama/Meta-Llama-3-8B"}}}


def relabelings(backend: str) -> list[dict[str, Any]]:
    b = body(backend)
    rules: list[dict[str, Any]] = render_all(b, parse_spec(b)).service_monitor["spec"][
        "endpoints"][0]["relabelings"]
    return rules


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_monitor_drops_a_not_ready_endpoint_under_either_discovery_role(
        backend: str) -> None:
    drops = [r for r in relabelings(backend) if r["action"] == "drop"
             and r["sourceLabels"] != [POD_IP]]  # test_forged_endpoints.py's
    assert drops == [{"action": "drop", "sourceLabels": [label], "regex": "false"}
                     for label in (ENDPOINTS_READY, ENDPOINTSLICE_READY)]


# The Prometheus Operator's names for a RelabelConfig's fields in the scrape job it writes;
# a field not here fails the test rather than going unchecked.
OPERATOR_FIELDS = {"sourceLabels": "source_labels", "targetLabel": "target_label",
                   "regex": "regex", "replacement": "replacement", "separator": "separator",
                   "modulus": "modulus"}


def as_scrape_job(rule: Mapping[str, Any]) -> dict[str, Any]:
    job = {OPERATOR_FIELDS[k]: v for k, v in rule.items() if k != "action"}
    return {"action": str(rule["action"]).lower(), **job}


@contextmanager
def nothing_listening() -> Iterator[str]:
    """An address that refuses: a pod whose meter cannot answer yet reads ``up`` 0 alike."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def rules_file(tmp_path: Path) -> Path:
    b = body("vllm")
    objects = desired_objects(b, parse_spec(b), replicas=2, monitoring=True,
                              operator_namespace="slopilot")
    spec = next(o for o in objects if o["kind"] == "PrometheusRule")["spec"]
    for group in spec["groups"]:
        group.pop("interval", None)  # the server's 1 s, not a 30 s wait for a first record
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=200))
    return path


@pytest.mark.prometheus
@pytest.mark.parametrize("ready_label", [ENDPOINTS_READY, ENDPOINTSLICE_READY])
def test_a_loading_pod_is_no_target_and_a_ready_one_that_fails_still_counts_as_down(
        ready_label: str, prometheus_factory: Callable[..., PrometheusServer],  # noqa: F811
        tmp_path: Path) -> None:
    relabel = [as_scrape_job(r) for r in relabelings("vllm")]
    with serve_metrics(lambda: b"slopilot_busy_ratio 0.5\n") as serving, \
            nothing_listening() as loading, nothing_listening() as failing:
        pods = {"serving": (serving, "true"), "loading": (loading, "false"),
                "failing": (failing, "true")}
        prom = prometheus_factory(
            # Each at its pod's own IP, as discovery labels a pod's endpoint.
            targets=[ScrapeTarget(job, [address], labels={ready_label: ready,
                                                          POD_IP: "127.0.0.1"},
                                  relabel_configs=relabel)
                     for job, (address, ready) in pods.items()],
            rule_files=[rules_file(tmp_path)])

        up_sel = 'up{slopilot_namespace="team",slopilot_deployment="chat"}'

        def scraped() -> dict[str, Any] | None:
            targets: dict[str, Any] = prom.get("/api/v1/targets")["data"]
            active = targets["activeTargets"]
            done = all(t["health"] != "unknown" for t in active) and \
                len(prom.query(up_sel)["data"]["result"]) == len(active) >= 2
            return targets if done else None

        def last_evaluation() -> str:
            return str(prom.get("/api/v1/rules")["data"]["groups"][0]["lastEvaluation"])

        targets = wait_for(scraped, "every target scraped", diagnose=lambda: prom.log[-2000:])
        # Recorded from every target's up: an evaluation after the scrapes above.
        before = last_evaluation()
        wait_for(lambda: last_evaluation() != before, "a rule evaluation after the scrapes")
        active = {t["labels"]["job"]: t["health"] for t in targets["activeTargets"]}
        assert active == {"serving": "up", "failing": "down"}
        assert [t["discoveredLabels"]["job"] for t in targets["droppedTargets"]] == \
            ["loading"]
        up = prom.query(up_sel)
        assert {s["metric"]["job"]: s["value"][1] for s in up["data"]["result"]} == \
            {"serving": "1", "failing": "0"}
        # The alert's figure: the ready pod that cannot be scraped, not the loading one.
        assert [s["value"][1] for s in prom.query(DOWN)["data"]["result"]] == ["1"]
