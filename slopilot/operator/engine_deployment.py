"""The engine Deployment: its pod template, the engine's container and, on vLLM, the meter's.

Knob changes reach the pods two ways. The built-in engine takes live knobs through
``PUT /admin/config`` and reads the ConfigMap only at start, so its pod template carries
a checksum of the *non-live* knobs alone (a change there needs a restart). vLLM has no live
reconfiguration: its knobs are command-line arguments and the checksum covers all of them,
so any knob change rolls the pods.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.server.admin_credential import ADMIN_TOKEN_SHA256_ENV
from slopilot.engine.slo import SLO_FILE_ENV
from slopilot.operator.connections_spec import connection_flags
from slopilot.operator.images import SHIPPED_IMAGES, Images
from slopilot.operator.knobs import VLLM_LACKS
from slopilot.operator.meter_container import guaranteed_qos, meter_command, meter_container
from slopilot.operator.model_source import pod_volume, token_env, volume_mount
from slopilot.operator.owned_meta import labels, object_meta, selector
from slopilot.operator.pod_layout import (
    ADMIN_PORT,
    ADMIN_PORT_NAME,
    CLIENTS_FILE,
    CONFIG_DIR,
    CONFIG_FILE,
    PORT,
    SLO_FILE,
    VLLM_PORT,
    VLLM_PORT_NAME,
    alerts_file_env,
    container_security_context,
)
from slopilot.operator.quantity import stored_form
from slopilot.operator.scheduling import pod_placement
from slopilot.operator.spec import Backend, LLMDeploymentSpec

CHECKSUM_ANNOTATION = "slopilot.dev/config-checksum"
TEMPLATE_ANNOTATION = "slopilot.dev/template-sha256"
"""On the Deployment (not its template, so adding it rolls no pod): the digest of the pod
template as rendered. The drift check asks only that the live object carry every rendered
field, as the API server and admission (a LimitRange's default limits) add their own; a
field the render drops, a memory limit removed from the spec, then looked covered and
stayed. A changed digest sends the template again, whose lists replace the live ones."""
RUN_AS = 10001


SCHEDULING_MARGIN_S = 300
"""What a rollout may take beyond a pod's own startup budget (``spec.model.startupTimeout``)
before the Deployment controller marks it ``ProgressDeadlineExceeded`` (the loop then
ends the trial ``rollout_stuck`` and rolls it back): scheduling and the image pull.
apps/v1's default deadline (600 s) is the default startup budget alone, and a deadline
shorter than the startup budget called a model still loading within its own time stuck."""
ROLLING: dict[str, Any] = {"type": "RollingUpdate",
                           "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
"""One new pod at a time, started beside the old ones, an old one stopped only once a new
one is available: every replica serves throughout (apps/v1's default, 25 % unavailable
rounded down and 25 % surge rounded up, is the same at 1-3 replicas and stops up to a
quarter of the fleet above). A rollout needs one pod's spare resources (its GPUs) in
the namespace's quota: max replicas + 1 pods (docs/operations.md)."""


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


PREFIX_CACHING_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching")


def _knob_values(c: EngineConfig) -> dict[str, str]:
    """The value of each vLLM flag that carries a tuned knob (``VLLM_APPLIES``)."""
    return {"--max-num-batched-tokens": str(c.effective_budget),
            "--long-prefill-token-threshold": str(c.chunk_size),
            "--max-num-seqs": str(vllm_max_num_seqs(c)), "--block-size": str(c.block_size)}


def _prefix_caching(c: EngineConfig) -> str:
    return PREFIX_CACHING_FLAGS[0] if c.enable_prefix_caching else PREFIX_CACHING_FLAGS[1]


def vllm_args(spec: LLMDeploymentSpec) -> tuple[list[str], tuple[str, ...]]:
    """vLLM's arguments for the knobs, and the knobs set in the spec that vLLM lacks."""
    c = spec.engine
    v = _knob_values(c)
    args = [spec.model_ref, "--served-model-name", spec.model_name, "--port", str(VLLM_PORT),
            "--max-num-batched-tokens", v["--max-num-batched-tokens"],
            "--enable-chunked-prefill",
            "--long-prefill-token-threshold", v["--long-prefill-token-threshold"],
            "--max-num-seqs", v["--max-num-seqs"], "--scheduling-policy", "priority",
            "--block-size", v["--block-size"], _prefix_caching(c)]
    if spec.gpu > 1:
        args += ["--tensor-parallel-size", str(spec.gpu)]
    lacking = [k for k in VLLM_LACKS if k in spec.explicit_knobs]
    if c.preemption_mode is PreemptionMode.RECOMPUTE and "preemption_mode" in lacking:
        lacking.remove("preemption_mode")  # vLLM's only mode: what was asked for
    return args, tuple(lacking)


def with_vllm_knobs(args: list[str], config: EngineConfig) -> list[str]:
    """``args``, a rendered vLLM container's, with ``config``'s knobs in place of the ones
    they carry, every other argument (model, port, parallelism) as rendered. ValueError
    naming a knob's flag that ``args`` lacks: not arguments this operator rendered."""
    out = list(args)
    for flag, value in _knob_values(config).items():
        if flag not in out[:-1]:
            raise ValueError(f"the vLLM arguments have no {flag} <value>")
        out[out.index(flag) + 1] = value
    where = [i for i, a in enumerate(out) if a in PREFIX_CACHING_FLAGS]
    if len(where) != 1:
        raise ValueError(f"the vLLM arguments have not one of {' or '.join(PREFIX_CACHING_FLAGS)}")
    out[where[0]] = _prefix_caching(config)
    return out


def vllm_checksum(args: list[str], meter: list[str]) -> str:
    """The pod template's ``CHECKSUM_ANNOTATION`` on vLLM: its engine's arguments and its
    meter's command."""
    return _checksum({"vllm": args, "meter": meter})


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
    if spec.ephemeral_storage:
        # The engine's alone is the pod's: the kubelet holds the pod's writes, its emptyDir
        # volumes included, to the sum of its containers' limits (the meter sets none).
        amounts["ephemeral-storage"] = stored_form(spec.ephemeral_storage)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


STARTUP_PERIOD_S = 10


def startup_failures(spec: LLMDeploymentSpec) -> int:
    """The startup probe's failureThreshold: ``spec.model.startupTimeout`` in probe
    periods, rounded up so that a pod is never given less than asked."""
    return max(1, math.ceil(spec.startup_timeout_s / STARTUP_PERIOD_S))


def progress_deadline_s(spec: LLMDeploymentSpec) -> int:
    """The Deployment's ``progressDeadlineSeconds``: the pods' startup budget as probed
    (``startup_failures`` periods), then ``SCHEDULING_MARGIN_S``."""
    return startup_failures(spec) * STARTUP_PERIOD_S + SCHEDULING_MARGIN_S


def _probe(period: int, failures: int, port: str) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


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
        env.append(alerts_file_env())
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
        # Model download and loading may take minutes: spec.model.startupTimeout.
        "startupProbe": _probe(STARTUP_PERIOD_S, startup_failures(spec), probe_port),
        "readinessProbe": _probe(5, 3, probe_port), "livenessProbe": _probe(10, 3, probe_port),
        "securityContext": container_security_context(),
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
        checksum = vllm_checksum(vllm_args(spec)[0], meter_command(spec))
    if spec.model_volume is not None:
        volumes.append(pod_volume(spec.model_volume))
    engine = _container(spec, admin_token_sha256, images.engine(spec.backend))
    containers = [engine]
    if spec.backend is Backend.VLLM:
        containers.append(meter_container(spec, images.meter,
                                          guaranteed_qos(engine.get("resources") or {})))
    template = {
        "metadata": {"labels": labels(name), "annotations": {CHECKSUM_ANNOTATION: checksum}},
        "spec": {
            "automountServiceAccountToken": False,
            # No Service's address as variables: a Service of the namespace named
            # "vllm" set VLLM_PORT=tcp://..., which vLLM refused to start on.
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS,
                                "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": containers,
            "volumes": volumes,
            **pod_placement(selector(name), spec.scheduling),
        },
    }
    meta = object_meta(body, name)
    meta["annotations"] = {TEMPLATE_ANNOTATION: _checksum(template)}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {"replicas": count, "selector": {"matchLabels": selector(name)},
                 "template": template, "strategy": ROLLING,
                 "progressDeadlineSeconds": progress_deadline_s(spec)},
    }
