"""How Prometheus scrapes an LLMDeployment's pods, and where it reads their latency.

The ServiceMonitor, which scrapes ready pods only, with the relabelings that make vLLM's
series read as the rules select them (also as a plain Prometheus job's
``metric_relabel_configs``), and each backend's latency sources. It scrapes the pods'
``http`` port, which on a vLLM pod is the meter's: vLLM's /metrics followed by the
verdicts, so the rules' per-``instance`` join of the two holds as on the built-in engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.operator.owned_meta import object_meta, selector
from slopilot.operator.pod_layout import SCRAPE_INTERVAL_S
from slopilot.operator.scrape_limits import scrape_limits
from slopilot.operator.spec import Backend, LLMDeploymentSpec
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    identity_labels,
)


def latency_sources(backend: Backend) -> LatencySources:
    """Where the backend's TTFT and TBT are read (the rules, the trial windows and the
    dashboard alike): vLLM's pods run the meter, whose client-side histograms read what
    vLLM's own leave out; the built-in engine's own are the client's already."""
    return VLLM_LATENCY if backend is Backend.VLLM else BUILTIN_LATENCY


def vllm_class_relabeling(cls: str) -> dict[str, Any]:
    """ServiceMonitor form: a series without ``priority_class`` (every vLLM series) gets
    the class ``cls``, so the per-class rules and panels see vLLM's traffic."""
    return {"action": "replace", "sourceLabels": ["priority_class"], "regex": "^$",
            "targetLabel": "priority_class", "replacement": cls}


def vllm_class_metric_relabel_config(cls: str) -> dict[str, Any]:
    """The same rule for a plain Prometheus job's ``metric_relabel_configs``."""
    return _plain_relabel_config(vllm_class_relabeling(cls))


# vLLM serves /metrics through prometheus_client's ASGI app (v0.11.0,
# vllm/entrypoints/openai/api_server.py, mount_metrics), which answers in the format the
# scraper asks for. From prometheus_client 0.23 (older than vLLM 0.11.0, which asks only
# for >= 0.18) an OpenMetrics answer to a scraper that does not offer
# escaping=allow-utf-8 (every Prometheus 2; a Prometheus 3 on legacy name validation)
# names each sample with "_" for ":", so Prometheus stores vllm_num_requests_running and
# every vllm:* selector reads nothing. This puts the colon back; a name already stored as
# vllm:* does not match, and vLLM 0.11 names none of its own series vllm_*.
VLLM_NAME_RELABELING: dict[str, Any] = {
    "action": "replace", "sourceLabels": ["__name__"], "regex": "vllm_(.+)",
    "targetLabel": "__name__", "replacement": "vllm:${1}"}


def vllm_metric_relabelings(cls: str) -> list[dict[str, Any]]:
    """ServiceMonitor ``metricRelabelings`` of a vLLM deployment: vLLM's names as the
    rules select them, and every series in the class ``cls``."""
    return [dict(VLLM_NAME_RELABELING), vllm_class_relabeling(cls)]


def _plain_relabel_config(rule: Mapping[str, Any]) -> dict[str, Any]:
    return {"action": rule["action"], "source_labels": list(rule["sourceLabels"]),
            "regex": rule["regex"], "target_label": rule["targetLabel"],
            "replacement": rule["replacement"]}


def vllm_metric_relabel_configs(cls: str) -> list[dict[str, Any]]:
    """The same rules for a plain Prometheus job's ``metric_relabel_configs``."""
    return [_plain_relabel_config(rule) for rule in vllm_metric_relabelings(cls)]


# Prometheus scrapes a Service's not-ready addresses too, and a pod is not ready while it
# starts, loads its model or rolls out (every vLLM trial rolls every pod): its meter then
# answers 502, ``up`` reads 0 and SlopilotTargetsDown's hold ended each tuning episode.
# Dropped here, such a pod is no target, and ``up`` 0 means a ready pod that cannot be
# scraped. The endpoints role (the Prometheus Operator's default) and the EndpointSlice
# one label readiness apart; a role that sets neither label leaves "" to match nothing.
ENDPOINT_READY_LABELS = ("__meta_kubernetes_endpoint_ready",
                         "__meta_kubernetes_endpointslice_endpoint_conditions_ready")


def not_ready_relabelings() -> list[dict[str, Any]]:
    """ServiceMonitor ``relabelings`` that drop a target whose endpoint is not ready."""
    return [{"action": "drop", "sourceLabels": [label], "regex": "false"}
            for label in ENDPOINT_READY_LABELS]


# The Service's endpoints are whatever its Endpoints (or EndpointSlices) say, and a
# tenant can write those by hand: a Service of their own with the deployment's labels,
# and an address of another namespace's pod, which admits Prometheus on ``http``. Scraped,
# that pod's series would carry the tenant's namespace and deployment (the identity
# labels below): its load and latency read in the tenant's status and dashboards. An
# address may name a pod (``targetRef``) and discovery then labels the target with that
# pod as the API server has it, ``__meta_kubernetes_pod_ip`` from its status, which no
# tenant writes, and only for a pod of the monitor's namespace (Prometheus resolves the
# reference in the namespaces it watches). A target is kept only where its address is
# its pod's own IP: a hand-written address that names no pod, or names a pod of the
# namespace that has another IP, is dropped. Prometheus's regexes cannot compare two
# labels (RE2: no backreferences), so the address's host is copied into a label of its
# own and ``keepequal`` (Prometheus 2.41, prometheus-operator 0.64) compares the two.
POD_IP_LABEL = "__meta_kubernetes_pod_ip"
ADDRESS_IP_LABEL = "__tmp_slopilot_address_ip"
# host:port, an IPv6 host in brackets, as discovery writes __address__.
ADDRESS_HOST = r"\[?([^\]]+?)\]?:[0-9]+"


def pod_backed_relabelings() -> list[dict[str, Any]]:
    """ServiceMonitor ``relabelings`` that keep only a target whose address is the IP of
    the namespace's pod its endpoint names: none else is a replica."""
    return [
        # No pod: also what keepequal would keep if the address's host were not found.
        {"action": "drop", "sourceLabels": [POD_IP_LABEL], "regex": "^$"},
        {"action": "replace", "sourceLabels": ["__address__"], "regex": ADDRESS_HOST,
         "targetLabel": ADDRESS_IP_LABEL, "replacement": "${1}"},
        {"action": "keepequal", "sourceLabels": [POD_IP_LABEL],
         "targetLabel": ADDRESS_IP_LABEL}]


def render_service_monitor(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    endpoint: dict[str, Any] = {
        "port": "http", "path": "/metrics", "interval": f"{SCRAPE_INTERVAL_S}s",
        # The rules select a deployment's series by namespace and name: two CRs named
        # chat in two namespaces are two deployments.
        "relabelings": not_ready_relabelings() + pod_backed_relabelings() + [
            {"action": "replace", "targetLabel": label, "replacement": value}
            for label, value in identity_labels(name, namespace).items()]}
    if spec.backend is Backend.VLLM:
        # The rules select vLLM's names with their colon, and the per-class rules and
        # panels need a class on every latency series.
        endpoint["metricRelabelings"] = vllm_metric_relabelings(spec.vllm_class)
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": object_meta(body, name),
            "spec": {"selector": {"matchLabels": selector(name)},
                     # Said, not assumed: only this namespace's Services of that name.
                     "namespaceSelector": {"matchNames": [namespace]},
                     "endpoints": [endpoint],
                     # Any pod of the namespace with the deployment's labels is scraped,
                     # a tenant's own among them: bounded by what a replica exports.
                     **scrape_limits(spec).to_service_monitor()}}
