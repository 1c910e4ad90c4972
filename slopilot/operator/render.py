"""Render the objects an LLMDeployment owns: pure functions from the spec to plain dicts.

Same body and spec in, identical dicts out (no clocks, no randomness), so the handler can
compare what it renders with what is in the cluster and patch only on a difference.

Each object has its renderer by job: the Deployment (``engine_deployment.py``, a vLLM
pod's meter in ``meter_container.py``, where its pods may land in ``scheduling.py``), the
PodDisruptionBudget (``disruption_budget.py``), the ServiceMonitor (``service_monitor.py``); the
small ConfigMap, Service and NetworkPolicy are here, where ``render_all`` assembles them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.operator.alert_spec import edge_factors
from slopilot.operator.disruption_budget import render_pod_disruption_budget
from slopilot.operator.engine_deployment import render_deployment, vllm_args
from slopilot.operator.images import SHIPPED_IMAGES, Images
from slopilot.operator.network_peers import DEFAULT_PROMETHEUS_PEERS, Peer
from slopilot.operator.owned_meta import object_meta, selector
from slopilot.operator.pod_layout import (
    ADMIN_PORT_NAME,
    ALERTS_FILE,
    CLIENTS_FILE,
    CONFIG_FILE,
    PORT,
    SLO_FILE,
)
from slopilot.operator.service_monitor import render_service_monitor
from slopilot.operator.spec import Backend, LLMDeploymentSpec

# The operator's pods, as manifests/operator.yaml labels them: the NetworkPolicy's only
# source for the admin port.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "slopilot-operator"}
DEFAULT_OPERATOR_NAMESPACE = "slopilot-system"


@dataclasses.dataclass(frozen=True)
class Rendered:
    """Everything one LLMDeployment owns, plus the knobs its backend cannot honour."""

    config_map: dict[str, Any]
    deployment: dict[str, Any]
    service: dict[str, Any]
    service_monitor: dict[str, Any]
    network_policy: dict[str, Any]
    pod_disruption_budget: dict[str, Any]
    unsupported_knobs: tuple[str, ...]

    def objects(self) -> list[dict[str, Any]]:
        return [self.config_map, self.deployment, self.service, self.network_policy,
                self.pod_disruption_budget, self.service_monitor]


def config_json(config: EngineConfig) -> str:
    """The knob file ``slopilot serve --config`` reads (stable key order)."""
    return json.dumps(config.to_dict(), sort_keys=True, indent=2) + "\n"


def render_config_map(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    """The knobs and the SLO the built-in engine starts with (it reads both only at
    start: a live change is a PUT, ``KubeDeploymentHandle.sync_config``); a vLLM pod's
    meter reads the SLO, again whenever the kubelet updates the file. Beside the SLO,
    the factors ``spec.alerts`` multiplies it by, which both read at their start only:
    every threshold the rules judge becomes an edge of their histograms
    (``alert_factors.py``). With ``spec.clients``, the grants, which the built-in engine
    re-reads when they change."""
    data = {CONFIG_FILE: config_json(spec.engine),
            SLO_FILE: json.dumps(spec.slo.to_dict(), sort_keys=True),
            ALERTS_FILE: json.dumps(edge_factors(spec.alerts).to_dict(), sort_keys=True)}
    if spec.clients is not None:
        data[CLIENTS_FILE] = json.dumps(spec.clients.to_dict(), sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": object_meta(body, f"{body['metadata']['name']}-engine"), "data": data}


def render_service(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {"apiVersion": "v1", "kind": "Service", "metadata": object_meta(body, name),
            "spec": {"type": "ClusterIP", "selector": selector(name), "ports": [
                {"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}


def render_network_policy(body: Mapping[str, Any], spec: LLMDeploymentSpec,
                          operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE,
                          http_peers: Sequence[Peer] = DEFAULT_PROMETHEUS_PEERS
                          ) -> dict[str, Any]:
    """Ingress to the engine pods: inference and /metrics from the pods of the CR's own
    namespace and ``http_peers`` (Prometheus, the administrator's extras;
    network_peers.py), the admin port from the operator's pods only, nothing else.

    Every rule names its sources: one without ``from`` admits every pod of the cluster,
    and NetworkPolicies only add, so no policy of the tenant's could take that back. A
    tenant admits more (its gateway's namespace) with a NetworkPolicy of its own beside
    this one. ``http`` is a vLLM pod's meter: vLLM's own port is in no rule, so a request
    that goes around the meter, unjudged, is refused."""
    name = body["metadata"]["name"]
    # podSelector alone: every pod of the policy's own namespace, the CR's.
    sources = [{"podSelector": {}}, *(peer.to_api() for peer in dict.fromkeys(http_peers))]
    ingress: list[dict[str, Any]] = [
        {"from": sources, "ports": [{"port": "http", "protocol": "TCP"}]}]
    if spec.backend is Backend.BUILTIN:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": operator_namespace}},
                      "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}],
            "ports": [{"port": ADMIN_PORT_NAME, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": object_meta(body, name),
            "spec": {"podSelector": {"matchLabels": selector(name)},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def render_all(body: Mapping[str, Any], spec: LLMDeploymentSpec,
               replicas: int | None = None, *,
               operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE,
               admin_token_sha256: str | None = None,
               images: Images = SHIPPED_IMAGES,
               http_peers: Sequence[Peer] = DEFAULT_PROMETHEUS_PEERS) -> Rendered:
    unsupported = vllm_args(spec)[1] if spec.backend is Backend.VLLM else ()
    return Rendered(config_map=render_config_map(body, spec),
                    deployment=render_deployment(body, spec, replicas,
                                                 admin_token_sha256=admin_token_sha256,
                                                 images=images),
                    service=render_service(body, spec),
                    service_monitor=render_service_monitor(body, spec),
                    network_policy=render_network_policy(body, spec, operator_namespace,
                                                         http_peers),
                    pod_disruption_budget=render_pod_disruption_budget(body),
                    unsupported_knobs=unsupported)
