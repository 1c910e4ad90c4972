"""Render the objects an LLMDeployment owns: pure functions from the spec to plain dicts.

Same body and spec in, identical dicts out (no clocks, no randomness), so the handler can
compare what it renders with what is in the cluster and patch only on a difference.

Knob changes reach the pods two ways. The built-in engine takes live knobs through
``PUT /admin/config`` and reads the ConfigMap only at start, so its pod template carries
a checksum of the *non-live* knobs alone (a change there needs a restart). vLLM has no live
reconfiguration: its knobs are command-line arguments and the checksum covers all of them,
so any knob change rolls the pods.

A vLLM pod has a second container, the meter (``slopilot meter``): vLLM exports no
per-request SLO verdicts, and the product of its histograms' shares read 81 % of P0's
tokens good on mixed traffic where 13.5 % were (docs/benchmarks.md). The meter takes the
pod's ``http`` port, forwards each request to vLLM on the loopback (vLLM moves to
``VLLM_PORT``), judges each streamed completion as its client sees it, and serves vLLM's
/metrics followed by its verdicts. The Service, the ServiceMonitor and the
NetworkPolicy keep ``http``, so the rules' per-``instance`` join of vLLM's series and the
verdicts holds unchanged. The meter re-reads the ConfigMap's SLO file when it changes:
an SLO edit rolls no vLLM pod, while its command line (the class it judges in) does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.server.admin_credential import ADMIN_TOKEN_SHA256_ENV
from slopilot.engine.slo import SLO_FILE_ENV
from slopilot.operator.connections_spec import connection_flags
from slopilot.operator.knobs import VLLM_LACKS
from slopilot.operator.model_source import pod_volume, token_env, volume_mount
from slopilot.operator.quantity import stored_form
from slopilot.operator.spec import Backend, LLMDeploymentSpec
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    VLLM_LATENCY,
    LatencySources,
    identity_labels,
)

API_VERSION = "slopilot.dev/v1alpha1"
KIND = "LLMDeployment"
PORT = 8000
# The built-in engine's /admin/* endpoints listen here, apart from inference, so that the
# NetworkPolicy can let only the operator reach them (`slopilot serve --admin-port`).
ADMIN_PORT = 8081
ADMIN_PORT_NAME = "admin"
# vLLM listens here behind its meter, which takes PORT. On every interface, not the
# loopback alone: the kubelet probes vLLM on the pod's IP. The NetworkPolicy names no rule
# for it, so other pods reach vLLM only through the meter.
VLLM_PORT = 8001
VLLM_PORT_NAME = "vllm"
# The operator's pods, as manifests/operator.yaml labels them: the NetworkPolicy's only
# source for the admin port.
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "slopilot-operator"}
DEFAULT_OPERATOR_NAMESPACE = "slopilot-system"
CONFIG_DIR = "/etc/slopilot"
CONFIG_FILE = "engine.json"
SLO_FILE = "slo.json"
CLIENTS_FILE = "clients.json"
CHECKSUM_ANNOTATION = "slopilot.dev/config-checksum"
TEMPLATE_ANNOTATION = "slopilot.dev/template-sha256"
"""On the Deployment (not its template, so adding it rolls no pod): the digest of the pod
template as rendered. The drift check asks only that the live object carry every rendered
field, as the API server and admission (a LimitRange's default limits) add their own; a
field the render drops, a memory limit removed from the spec, then looked covered and
stayed. A changed digest sends the template again, whose lists replace the live ones."""
DEFAULT_IMAGES = {Backend.BUILTIN: "ghcr.io/slopilot/slopilot:0.1.0",
                  Backend.VLLM: "vllm/vllm-openai:v0.11.0"}
"""The shipped default engine image of each backend (``Images`` holds the ones used)."""
RUN_AS = 10001
METER_IMAGE = DEFAULT_IMAGES[Backend.BUILTIN]
"""The shipped meter image. The meter is the operator's code in the operator's image,
chosen by the operator: the image allow-list (``policy.policy_problems``) judges only the
image a tenant asks for."""


@dataclasses.dataclass(frozen=True)
class Images:
    """The images the operator picks: the meter's, and each backend's engine where the CR
    names none. The administrator's (``settings.operator_images``: an air-gapped cluster
    runs mirrors), else the shipped ones; never a CR's, since the meter judges its own
    tenant's goodput."""

    meter: str = METER_IMAGE
    builtin: str = DEFAULT_IMAGES[Backend.BUILTIN]
    vllm: str = DEFAULT_IMAGES[Backend.VLLM]

    def engine(self, backend: Backend) -> str:
        """``backend``'s default engine image."""
        return {Backend.BUILTIN: self.builtin, Backend.VLLM: self.vllm}[backend]


SHIPPED_IMAGES = Images()
# The meter's resources. CPU: a request, no limit (but see Guaranteed pods, below). The
# request is its share when the node is busy: the meter spent 117-153 us of CPU a
# streamed chunk, all in (the request's forward and the stream's judging shared over its
# 64 chunks; benchmarks/meter_truth.py), so half a core holds about 3,500 chunks a
# second, a replica streaming over a hundred requests at 30 tokens a second. One process
# takes one core at most (about 7,000). A CFS limit would hold every stream of the
# replica until the next 100 ms period whenever a burst used up the quota: token gaps
# added on the path the meter judges. Memory: about 65 MiB is the interpreter with the
# server stack loaded (slopilot's CLI, fastapi, uvicorn, httpx); the rest holds the
# streams in flight, running or queued in vLLM (a few tens of KiB of buffers each: a
# thousand in some tens of MiB), and a copy of vLLM's exposition (hundreds of KiB) at
# each scrape. A limit, equal to the request: a proxy that leaks is restarted rather than
# taking the node's memory from vLLM.
# Guaranteed pods: where the engine's CPU and memory requests equal its limits the user
# sized the pod Guaranteed, and one container without a CPU limit makes it Burstable,
# evicted before Guaranteed pods under node pressure: for a GPU pod, its loaded model
# and its GPU lost. There the meter's CPU limit equals its request, and the trade is the
# throttling above: past about 3,500 chunks a second at 500m a burst waits for the next
# CFS period, added to the token gaps the meter judges (``_meter_resources``).
METER_CPU_REQUEST = "500m"
METER_MEMORY = "256Mi"


@dataclasses.dataclass(frozen=True)
class Rendered:
    """Everything one LLMDeployment owns, plus the knobs its backend cannot honour."""

    config_map: dict[str, Any]
    deployment: dict[str, Any]
    service: dict[str, Any]
    service_monitor: dict[str, Any]
    network_policy: dict[str, Any]
    unsupported_knobs: tuple[str, ...]

    def objects(self) -> list[dict[str, Any]]:
        return [self.config_map, self.deployment, self.service, self.network_policy,
                self.service_monitor]


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference every owned object carries (kopf's, as ``kopf.adopt`` sets
    it). kopf.adopt itself is not used: it would also copy the CR's labels, which tenants
    edit without a spec change, onto the children."""
    return dict(kopf.build_owner_reference(cast("kopf.Body", {
        **body, "apiVersion": API_VERSION, "kind": KIND}), controller=True,
        block_owner_deletion=True))


MANAGED = {"app.kubernetes.io/managed-by": "slopilot-operator"}  # on every owned object


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "slopilot-engine", "app.kubernetes.io/instance": name,
            **MANAGED, "slopilot.dev/llmdeployment": name}


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, "slopilot.dev/llmdeployment": name}


def _meta(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": body["metadata"]["namespace"],
            "labels": labels(body["metadata"]["name"]),
            "ownerReferences": [owner_reference(body)]}


def config_json(config: EngineConfig) -> str:
    """The knob file ``slopilot serve --config`` reads (stable key order)."""
    return json.dumps(config.to_dict(), sort_keys=True, indent=2) + "\n"


def _checksum(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def vllm_max_num_seqs(config: EngineConfig) -> int:
    """The ``--max-num-seqs`` vLLM is given: the knob, at most the token budget.

    vLLM refuses to start when max_num_seqs exceeds max_num_batched_tokens (v0.11.0,
    vllm/config/scheduler.py, ``SchedulerConfig._verify_args``: a ValueError), and the
    tuner's space draws the two independently (a budget of 256 beside up to 1024
    sequences). A step schedules at least a token for each request it runs, so no more
    requests than the budget run in one step anyway: the budget is the same limit in a
    form vLLM accepts, where the raw knob would crash-loop every replica of a trial. It is
    the built-in engine's own limit too (``EngineConfig.effective_max_num_seqs``)."""
    return config.effective_max_num_seqs


def vllm_args(spec: LLMDeploymentSpec) -> tuple[list[str], tuple[str, ...]]:
    """vLLM's arguments for the knobs, and the knobs set in the spec that vLLM lacks."""
    c = spec.engine
    args = [spec.model_ref, "--served-model-name", spec.model_name, "--port", str(VLLM_PORT),
            "--max-num-batched-tokens", str(c.effective_budget),
            "--enable-chunked-prefill", "--long-prefill-token-threshold", str(c.chunk_size),
            "--max-num-seqs", str(vllm_max_num_seqs(c)), "--scheduling-policy", "priority",
            "--block-size", str(c.block_size),
            "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching"]
    if spec.gpu > 1:
        args += ["--tensor-parallel-size", str(spec.gpu)]
    lacking = [k for k in VLLM_LACKS if k in spec.explicit_knobs]
    if c.preemption_mode is PreemptionMode.RECOMPUTE and "preemption_mode" in lacking:
        lacking.remove("preemption_mode")  # vLLM's only mode: what was asked for
    return args, tuple(lacking)


def meter_command(spec: LLMDeploymentSpec) -> list[str]:
    """The meter's command line: every request judged in ``spec.vllm_class``, the class
    the ServiceMonitor relabels vLLM's own series into."""
    return ["slopilot", "meter", "--upstream", f"http://127.0.0.1:{VLLM_PORT}",
            "--port", str(PORT), "--slo-file", f"{CONFIG_DIR}/{SLO_FILE}",
            "--priority-class", spec.vllm_class, *connection_flags(spec.connections)]


def render_config_map(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    """The knobs and the SLO the built-in engine starts with (it reads both only at
    start: a live change is a PUT, ``KubeDeploymentHandle.sync_config``); a vLLM pod's
    meter reads the SLO, again whenever the kubelet updates the file. With
    ``spec.clients``, the grants, which the built-in engine re-reads when they change."""
    data = {CONFIG_FILE: config_json(spec.engine),
            SLO_FILE: json.dumps(spec.slo.to_dict(), sort_keys=True)}
    if spec.clients is not None:
        data[CLIENTS_FILE] = json.dumps(spec.clients.to_dict(), sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(body, f"{body['metadata']['name']}-engine"), "data": data}


def _resources(spec: LLMDeploymentSpec) -> dict[str, Any]:
    # As the API server stores them (strings, canonical: "1", "500m"), so the object
    # read back is the object rendered; a value it would refuse is left as written, for
    # the reconcile's check to name (reconcile.object_problems).
    amounts: dict[str, Any] = {}
    if spec.cpu:
        amounts["cpu"] = stored_form(spec.cpu)
    if spec.memory:
        amounts["memory"] = stored_form(spec.memory)
    if spec.gpu:
        amounts["nvidia.com/gpu"] = str(spec.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _probe(period: int, failures: int, port: str) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def _security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def _meter_probe(period: int, failures: int) -> dict[str, Any]:
    # A connection only: the meter's /health is vLLM's, proxied, which vLLM's own probes
    # gate already; asked of the meter, it would restart the meter while vLLM loads.
    return {"tcpSocket": {"port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def _guaranteed(resources: Mapping[str, Any]) -> bool:
    """Whether a container's resources meet the Guaranteed QoS class's rule: CPU and
    memory limits, each request equal to its limit (an absent request defaults to it)."""
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return all(k in limits and requests.get(k, limits[k]) == limits[k]
               for k in ("cpu", "memory"))


def _meter_resources(guaranteed_pod: bool) -> dict[str, Any]:
    """The meter's share (the constants' comment says why each): a CPU limit only where
    the rest of the pod is Guaranteed, to keep it so."""
    requests = {"cpu": METER_CPU_REQUEST, "memory": METER_MEMORY}
    limits = dict(requests) if guaranteed_pod else {"memory": METER_MEMORY}
    return {"requests": requests, "limits": limits}


def _meter_container(spec: LLMDeploymentSpec, image: str,
                     guaranteed_pod: bool) -> dict[str, Any]:
    return {
        "name": "meter", "image": image, "command": meter_command(spec),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": "/tmp"}],
        # The directory, never a subPath: the kubelet updates no subPath mount, and an
        # SLO edit reaches the meter only by the file changing. /tmp is its own, not the
        # pod's: the tenant's vLLM image has no way into the meter's files.
        "volumeMounts": [{"name": "meter-tmp", "mountPath": "/tmp"},
                         {"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "readinessProbe": _meter_probe(5, 3), "livenessProbe": _meter_probe(10, 3),
        "resources": _meter_resources(guaranteed_pod),
        "securityContext": _security_context(),
    }


def _container(spec: LLMDeploymentSpec, admin_token_sha256: str | None,
               default_image: str) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"},
                                     {"name": "cache", "mountPath": "/cache"}]
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"},
                                 {"name": "HF_HOME", "value": "/cache/huggingface"},
                                 {"name": "XDG_CACHE_HOME", "value": "/cache"}]
    if spec.backend is Backend.BUILTIN:
        ports = [{"name": "http", "containerPort": PORT, "protocol": "TCP"},
                 {"name": ADMIN_PORT_NAME, "containerPort": ADMIN_PORT, "protocol": "TCP"}]
        probe_port = "http"
        command = ["slopilot", "serve", "--executor", "torch", "--model", spec.model_ref,
                   "--port", str(PORT), "--admin-port", str(ADMIN_PORT),
                   "--config", f"{CONFIG_DIR}/{CONFIG_FILE}",
                   *connection_flags(spec.connections)]
        if spec.clients is not None:
            # A flag, not an environment variable as the SLO's: an image too old to
            # enforce grants refuses to start rather than serving every client any class.
            # The flag comes and goes with spec.clients, so adding or removing it rolls the
            # pods (a server started without it has no file to re-read); an edit of the
            # grants rolls none (not in the checksum: the server re-reads the file, which
            # the kubelet updates in the directory mount below).
            command += ["--clients", f"{CONFIG_DIR}/{CLIENTS_FILE}"]
        args: list[str] = []
        # The directory, never a subPath: the kubelet updates no subPath mount.
        mounts.append({"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True})
        # An environment variable, not --slo: an older image ignores it rather than
        # refusing an unknown flag, and only then judges no requests.
        env.append({"name": SLO_FILE_ENV, "value": f"{CONFIG_DIR}/{SLO_FILE}"})
        if admin_token_sha256 is not None:
            # The digest admits the operator's token and reveals nothing of it, so it may
            # sit in the template: no Secret in the tenant's namespace (tokens.py).
            env.append({"name": ADMIN_TOKEN_SHA256_ENV, "value": admin_token_sha256})
        if spec.cpu:
            # OpenMP starts a thread per CPU it can see: under a CFS quota without an
            # exclusive cpuset that is every CPU of the node, most of them throttled.
            # The downward API gives the limit rounded up (1500m -> 2).
            env.append({"name": "OMP_NUM_THREADS", "valueFrom": {"resourceFieldRef": {
                "containerName": "engine", "resource": "limits.cpu", "divisor": "1"}}})
    else:
        command = ["vllm", "serve"]
        args = vllm_args(spec)[0]
        ports = [{"name": VLLM_PORT_NAME, "containerPort": VLLM_PORT, "protocol": "TCP"}]
        probe_port = VLLM_PORT_NAME
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})  # NCCL and torch workers
        if spec.token_secret is not None:
            # The engine's alone, not the meter's: only vLLM downloads from the hub.
            env.append(token_env(spec.token_secret))
    if spec.model_volume is not None:
        mounts.append(volume_mount(spec.model_volume))
    container: dict[str, Any] = {
        "name": "engine", "image": spec.image or default_image,
        "command": command, "ports": ports, "env": env, "volumeMounts": mounts,
        "startupProbe": _probe(10, 60, probe_port),  # model loading may take minutes
        "readinessProbe": _probe(5, 3, probe_port), "livenessProbe": _probe(10, 3, probe_port),
        "securityContext": _security_context(),
    }
    if args:
        container["args"] = args
    if resources := _resources(spec):
        container["resources"] = resources
    return container


def render_deployment(body: Mapping[str, Any], spec: LLMDeploymentSpec,
                      replicas: int | None = None, *,
                      admin_token_sha256: str | None = None,
                      images: Images = SHIPPED_IMAGES) -> dict[str, Any]:
    """The engine Deployment; ``replicas`` defaults to max(min, 1) (the controller moves it).
    ``admin_token_sha256``: the digest of the operator's admin token for this CR
    (``TokenMint.sha256_for_body``); without it a built-in engine's admin API is off.
    ``images``: the operator's (``OperatorPolicy.images``); ``spec.image`` replaces only
    the engine's."""
    name = body["metadata"]["name"]
    count = replicas if replicas is not None else min(max(spec.min_replicas, 1), spec.max_replicas)
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}},
                                     {"name": "cache", "emptyDir": {}}]
    if spec.backend is Backend.BUILTIN:
        volumes.append({"name": "engine-config", "configMap": {"name": f"{name}-engine"}})
        restart_knobs = {k: v for k, v in spec.engine.to_dict().items()
                         if k in EngineConfig.restart_knobs()}
        checksum = _checksum(restart_knobs)
    else:
        volumes += [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                    {"name": "meter-tmp", "emptyDir": {}},
                    {"name": "engine-config", "configMap": {"name": f"{name}-engine"}}]
        # Not the SLO: the meter re-reads the file. Its class is on its command line.
        checksum = _checksum({"vllm": vllm_args(spec)[0], "meter": meter_command(spec)})
    if spec.model_volume is not None:
        volumes.append(pod_volume(spec.model_volume))
    engine = _container(spec, admin_token_sha256, images.engine(spec.backend))
    containers = [engine]
    if spec.backend is Backend.VLLM:
        containers.append(_meter_container(spec, images.meter,
                                           _guaranteed(engine.get("resources") or {})))
    template = {
        "metadata": {"labels": labels(name), "annotations": {CHECKSUM_ANNOTATION: checksum}},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS,
                                "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": containers,
            "volumes": volumes,
        },
    }
    meta = _meta(body, name)
    meta["annotations"] = {TEMPLATE_ANNOTATION: _checksum(template)}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": count, "selector": {"matchLabels": selector(name)},
                 "template": template},
    }


def render_service(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(body, name),
            "spec": {"type": "ClusterIP", "selector": selector(name), "ports": [
                {"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}


def render_network_policy(body: Mapping[str, Any], spec: LLMDeploymentSpec,
                          operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
                          ) -> dict[str, Any]:
    """Ingress to the engine pods: inference and /metrics from anywhere the cluster's
    own policies allow, the admin port from the operator's pods only (and nothing else).
    ``http`` is a vLLM pod's meter: vLLM's own port is in no rule, so a request that
    goes around the meter, unjudged, is refused."""
    name = body["metadata"]["name"]
    ingress: list[dict[str, Any]] = [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    if spec.backend is Backend.BUILTIN:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {
                          "kubernetes.io/metadata.name": operator_namespace}},
                      "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}],
            "ports": [{"port": ADMIN_PORT_NAME, "protocol": "TCP"}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(body, name),
            "spec": {"podSelector": {"matchLabels": selector(name)},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


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


def render_service_monitor(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> dict[str, Any]:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    endpoint: dict[str, Any] = {
        "port": "http", "path": "/metrics", "interval": "15s",
        # The rules select a deployment's series by namespace and name: two CRs named
        # chat in two namespaces are two deployments.
        "relabelings": [{"action": "replace", "targetLabel": label, "replacement": value}
                        for label, value in identity_labels(name, namespace).items()]}
    if spec.backend is Backend.VLLM:
        # The rules select vLLM's names with their colon, and the per-class rules and
        # panels need a class on every latency series.
        endpoint["metricRelabelings"] = vllm_metric_relabelings(spec.vllm_class)
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": _meta(body, name),
            "spec": {"selector": {"matchLabels": selector(name)},
                     # Said, not assumed: only this namespace's Services of that name.
                     "namespaceSelector": {"matchNames": [namespace]},
                     "endpoints": [endpoint]}}


def render_all(body: Mapping[str, Any], spec: LLMDeploymentSpec,
               replicas: int | None = None, *,
               operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE,
               admin_token_sha256: str | None = None,
               images: Images = SHIPPED_IMAGES) -> Rendered:
    unsupported = vllm_args(spec)[1] if spec.backend is Backend.VLLM else ()
    return Rendered(config_map=render_config_map(body, spec),
                    deployment=render_deployment(body, spec, replicas,
                                                 admin_token_sha256=admin_token_sha256,
                                                 images=images),
                    service=render_service(body, spec),
                    service_monitor=render_service_monitor(body, spec),
                    network_policy=render_network_policy(body, spec, operator_namespace),
                    unsupported_knobs=unsupported)
