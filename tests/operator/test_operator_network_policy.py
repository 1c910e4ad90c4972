"""The operator's own pods are closed to the cluster but for Prometheus on ``metrics``.

Without a NetworkPolicy of their own, every pod of every tenant reached the operator's
``--metrics`` port (8081), which names every tenant's namespaces and deployments and their
tuning state, and its liveness port (8080). The shipped policy admits Prometheus's pods
to ``metrics`` and no one else to anything; the kubelet's probes come from the node, which
a NetworkPolicy does not filter (Kubernetes' own rule), so ``health`` needs no rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE, OPERATOR_POD_LABELS

ROOT = Path(__file__).parents[2]
MANIFESTS = ROOT / "manifests"
POLICY = MANIFESTS / "operator-network-policy.yaml"
PROMETHEUS = ({"kubernetes.io/metadata.name": "monitoring"},
              {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})
"""A Prometheus Operator's Prometheus pod in ``monitoring`` (namespace, pod labels)."""


def operator_pod() -> dict[str, Any]:
    (deployment,) = [d for d in yaml.safe_load_all((MANIFESTS / "operator.yaml").read_text())
                     if d]
    return dict(deployment["spec"]["template"])


def policy() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(POLICY.read_text(encoding="utf-8")) if d]
    return dict(doc)


def port_names() -> dict[int, str]:
    (container,) = operator_pod()["spec"]["containers"]
    return {p["containerPort"]: p["name"] for p in container["ports"]}


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    assert set(selector or {}) <= {"matchLabels"}, "only matchLabels is read here"
    return (selector or {}).get("matchLabels", {}).items() <= labels.items()


def admits(namespace: dict[str, str], pod: dict[str, str], port: int) -> bool:
    """Whether the shipped policy lets a pod (its namespace's labels, its own) reach the
    operator pod's ``port`` (NetworkPolicy's rules: peers OR-ed, a peer's selectors
    AND-ed, a peer's missing namespaceSelector the policy's own namespace)."""
    spec = policy()["spec"]
    name = port_names()[port]
    for rule in spec.get("ingress") or ():
        if not any(p.get("port") in (port, name) for p in rule.get("ports") or ()):
            continue
        for peer in rule["from"]:
            in_namespace = matches(peer["namespaceSelector"], namespace) \
                if "namespaceSelector" in peer \
                else namespace.get("kubernetes.io/metadata.name") == DEFAULT_OPERATOR_NAMESPACE
            if in_namespace and matches(peer.get("podSelector"), pod):
                return True
    return False


def test_the_policy_is_installed_and_selects_the_operators_pods_for_ingress() -> None:
    (kustomization,) = yaml.safe_load_all((MANIFESTS / "kustomization.yaml").read_text())
    assert POLICY.name in kustomization["resources"]
    doc = policy()
    assert (doc["kind"], doc["metadata"]["namespace"]) == ("NetworkPolicy",
                                                           DEFAULT_OPERATOR_NAMESPACE)
    assert doc["spec"]["policyTypes"] == ["Ingress"]
    assert OPERATOR_POD_LABELS.items() <= doc["spec"]["podSelector"]["matchLabels"].items() \
        <= operator_pod()["metadata"]["labels"].items()


def test_prometheus_alone_reaches_metrics_and_no_pod_reaches_health() -> None:
    ports = {name: port for port, name in port_names().items()}
    assert set(ports) == {"health", "metrics"}
    assert admits(*PROMETHEUS, ports["metrics"])
    assert not admits(*PROMETHEUS, ports["health"])
    tenant = {"kubernetes.io/metadata.name": "team-a"}
    for namespace, pod in [
            (tenant, {"app": "chat"}),
            # A tenant's pod labelled as Prometheus, outside Prometheus' namespace.
            (tenant, {"app.kubernetes.io/name": "prometheus"}),
            # Any other pod of Prometheus' namespace (Grafana, Alertmanager).
            (PROMETHEUS[0], {"app.kubernetes.io/name": "grafana"}),
            # The operator's own namespace.
            ({"kubernetes.io/metadata.name": DEFAULT_OPERATOR_NAMESPACE}, {"app": "x"})]:
        for port in ports.values():
            assert not admits(namespace, pod, port), (namespace, pod, port)


def test_the_admitted_prometheus_is_the_one_the_operator_may_query() -> None:
    """The namespace the policy admits is the one ``SLOPILOT_ALLOWED_PROMETHEUS`` names
    (``prometheus-operated.monitoring``): one Prometheus, set up in one place."""
    (container,) = operator_pod()["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    hosts = {urlsplit(f"//{entry.strip()}").hostname
             for entry in env["SLOPILOT_ALLOWED_PROMETHEUS"].split(",")}
    namespaces = {host.split(".")[1] for host in hosts if host}
    (rule,) = policy()["spec"]["ingress"]
    assert {peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for peer in rule["from"]} == namespaces


@pytest.mark.parametrize("port", sorted(port_names()))
def test_the_ports_table_names_each_of_the_operators_ports(port: int) -> None:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert re.search(rf"^\| operator {port} \(`{port_names()[port]}`\) \|", text, re.M), port
