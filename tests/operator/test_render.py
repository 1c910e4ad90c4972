"""Owned objects rendered from a spec: builtin and vLLM, ownership, security, idempotence."""

from __future__ import annotations

import itertools
import json
from typing import Any

import kubernetes_validate
import pytest

from slopilot.operator.engine_deployment import CHECKSUM_ANNOTATION, vllm_args
from slopilot.operator.render import config_json, render_all
from slopilot.operator.service_monitor import not_ready_relabelings, pod_backed_relabelings
from slopilot.operator.spec import LLMDeploymentSpec, SpecError, parse_spec

KUBE_VERSION = "1.33.0"
UID = "0b0e9a4e-4c1e-4d55-9b5e-1c9a3f6f0d11"


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": UID},
            "spec": {"model": {"name": "smollm2-135m", "path": "/models/smollm2"}, **spec}}


def render(**spec: Any) -> tuple[dict[str, Any], LLMDeploymentSpec]:
    b = body(**spec)
    return b, parse_spec(b)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_builtin_engine_pod_command_config_and_token() -> None:
    b, spec = render(resources={"gpu": 2, "cpu": "4", "memory": "16Gi"},
                     engine={"tokenBudget": 2048, "chunkSize": 1024})
    out = render_all(b, spec, admin_token_sha256="ab" * 32)
    c = container(out.deployment)
    assert c["command"] == ["slopilot", "serve", "--executor", "torch", "--model",
                            "/models/smollm2", "--port", "8000", "--admin-port", "8081",
                            "--config", "/etc/slopilot/engine.json"]
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", 8000),
                                                                     ("admin", 8081)]
    knobs = json.loads(out.config_map["data"]["engine.json"])
    assert knobs["token_budget"] == 2048 and knobs["chunk_size"] == 1024
    assert knobs["preemption_mode"] == "auto"
    assert {"name": "engine-config", "mountPath": "/etc/slopilot", "readOnly": True} in c[
        "volumeMounts"]
    # The pods get the token's digest only: no Secret holds the token, none is referenced.
    assert {"name": "SLOPILOT_ADMIN_TOKEN_SHA256", "value": "ab" * 32} in c["env"]
    assert all(e["name"] != "SLOPILOT_ADMIN_TOKEN" for e in c["env"])
    assert "secret" not in json.dumps(out.objects()).lower()
    # Strings, as the API server stores them: a number read back as "2" was drift.
    assert c["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"}
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert out.unsupported_knobs == ()


def test_probes_hit_health_on_the_named_port() -> None:
    c = container(render_all(*render()).deployment)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["ports"][0]["containerPort"] == 8000


def test_security_context_is_locked_down() -> None:
    pod = render_all(*render()).deployment["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    mounted = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/tmp", "/cache"} <= mounted
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]


def test_every_owned_object_points_at_its_llmdeployment() -> None:
    out = render_all(*render())
    for obj in out.objects():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
                       "name": "chat", "uid": UID, "controller": True,
                       "blockOwnerDeletion": True}
        assert obj["metadata"]["namespace"] == "team"


def test_service_and_monitor_select_the_engine_pods() -> None:
    out = render_all(*render())
    pod_labels = out.deployment["spec"]["template"]["metadata"]["labels"]
    selector = out.service["spec"]["selector"]
    assert selector.items() <= pod_labels.items()
    assert out.deployment["spec"]["selector"]["matchLabels"] == selector
    monitor = out.service_monitor
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= out.service["metadata"][
        "labels"].items()
    assert monitor["spec"]["endpoints"][0] == {
        "port": "http", "path": "/metrics", "interval": "15s",
        # The rendered rules select series by namespace and name (tuner/rules.py).
        # Only ready pods are targets (tests/operator/test_ready_targets.py).
        # Only a pod's own address (tests/operator/test_forged_endpoints.py).
        "relabelings": [*not_ready_relabelings(), *pod_backed_relabelings(),
                        {"action": "replace", "targetLabel": "slopilot_namespace",
                         "replacement": "team"},
                        {"action": "replace", "targetLabel": "slopilot_deployment",
                         "replacement": "chat"}]}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team"]}


def test_vllm_args_map_the_knobs() -> None:
    b, spec = render(backend="vllm", resources={"gpu": 4},
                     engine={"tokenBudget": 1000, "chunkSize": 256, "maxNumSeqs": 64,
                             "blockSize": 32})
    args, lacking = vllm_args(spec)
    pairs = dict(itertools.pairwise(args))
    assert args[0] == "/models/smollm2"
    assert pairs["--max-num-batched-tokens"] == "1024"  # 1000 rounded up to the 256 tiles
    assert pairs["--long-prefill-token-threshold"] == "256"
    assert pairs["--max-num-seqs"] == "64"
    assert pairs["--scheduling-policy"] == "priority"
    assert pairs["--block-size"] == "32"
    assert pairs["--tensor-parallel-size"] == "4"
    assert lacking == ()
    c = container(render_all(b, spec).deployment)
    assert c["command"] == ["vllm", "serve"] and c["args"] == args
    assert all(e["name"] != "SLOPILOT_ADMIN_TOKEN" for e in c["env"])


def test_vllm_names_the_knobs_it_lacks() -> None:
    b, spec = render(backend="vllm", engine={"kvWatermark": 0.1, "preemption": {
        "mode": "swap", "maxPerStep": 4, "swapTimeoutMs": 10}})
    assert render_all(b, spec).unsupported_knobs == (
        "preemption_mode", "max_preemptions_per_step", "swap_timeout_ms", "kv_watermark")
    _, recompute = render(backend="vllm", engine={"preemption": {"mode": "recompute"}})
    assert vllm_args(recompute)[1] == ()


def checksum(out: Any) -> str:
    return str(out.deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION])


def test_knob_changes_roll_vllm_pods_but_not_live_builtin_knobs() -> None:
    vllm_a = render_all(*render(backend="vllm", engine={"chunkSize": 256}))
    vllm_b = render_all(*render(backend="vllm", engine={"chunkSize": 512}))
    assert checksum(vllm_a) != checksum(vllm_b)
    live_a = render_all(*render(engine={"chunkSize": 256}))
    live_b = render_all(*render(engine={"chunkSize": 512}))
    assert checksum(live_a) == checksum(live_b)  # applied by PUT /admin/config instead
    restart = render_all(*render(engine={"blockSize": 32}))
    assert checksum(restart) != checksum(live_a)


def test_rendering_is_idempotent() -> None:
    first = render_all(*render(backend="vllm", engine={"maxNumSeqs": 8}))
    second = render_all(*render(backend="vllm", engine={"maxNumSeqs": 8}))
    assert first == second
    assert json.dumps(first.objects(), sort_keys=True) == json.dumps(second.objects(),
                                                                     sort_keys=True)


def test_replicas_start_at_min_but_at_least_one() -> None:
    assert render_all(*render(replicas={"min": 0, "max": 3})).deployment["spec"]["replicas"] == 1
    assert render_all(*render(replicas={"min": 2, "max": 3})).deployment["spec"]["replicas"] == 2
    assert render_all(*render(), replicas=5).deployment["spec"]["replicas"] == 5


def test_config_json_is_stable_and_complete() -> None:
    spec = parse_spec(body())
    assert config_json(spec.engine) == config_json(spec.engine)
    assert set(json.loads(config_json(spec.engine))) == set(spec.engine.to_dict())


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_builtin_kinds_validate_against_kubernetes(backend: str) -> None:
    out = render_all(*render(backend=backend,
                             resources={"gpu": 1, "cpu": "1500m", "memory": "8Gi"}))
    for obj in (out.config_map, out.deployment, out.service, out.network_policy):
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_only_the_operators_pods_may_reach_the_admin_port() -> None:
    policy = render_all(*render(), operator_namespace="ops").network_policy
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "chat", "slopilot.dev/llmdeployment": "chat"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    inference, admin = policy["spec"]["ingress"]
    # Inference and /metrics: the CR's own namespace and Prometheus (every source named:
    # a rule without ``from`` admits the whole cluster, test_engine_network_policy.py);
    # the admin port: the operator's pods in its namespace only.
    assert inference == {"from": [{"podSelector": {}}, {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "ports": [{"port": "http", "protocol": "TCP"}]}
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert admin["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "slopilot-operator"}}}]
    # vLLM has no admin endpoint: nothing but inference (its meter's port) is open.
    vllm = render_all(*render(backend="vllm")).network_policy
    assert vllm["spec"]["ingress"] == [inference]
    ports = container(render_all(*render(backend="vllm")).deployment)["ports"]
    assert [p["name"] for p in ports] == ["vllm"]


def test_the_cpu_engine_starts_as_many_threads_as_its_cpu_limit() -> None:
    # Under a CFS quota without an exclusive cpuset, OpenMP counts every CPU of the node:
    # 64 threads on a 2-CPU limit spend most of each step throttled.
    c = container(render_all(*render(resources={"cpu": "1500m", "memory": "4Gi"})).deployment)
    threads = [e for e in c["env"] if e["name"] == "OMP_NUM_THREADS"]
    # The kubelet rounds the limit up (1500m -> 2), as the downward API does.
    assert threads == [{"name": "OMP_NUM_THREADS", "valueFrom": {"resourceFieldRef": {
        "containerName": "engine", "resource": "limits.cpu", "divisor": "1"}}}]


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_ephemeral_storage_bounds_what_a_pod_writes_to_its_node(backend: str) -> None:
    """A vLLM pod downloads its model into the /cache emptyDir: unbounded, one tenant's
    70B model filled the node's disk under every other tenant's pods. The engine's
    ephemeral-storage limit is the pod's (the kubelet sums its containers' limits and
    holds the pod's writes, emptyDir volumes included, to it)."""
    spec = {"backend": backend, "resources": {"ephemeralStorage": "200Gi", "cpu": "2"}}
    c = container(render_all(*render(**spec)).deployment)
    assert c["resources"]["requests"]["ephemeral-storage"] == "200Gi"
    assert c["resources"]["limits"]["ephemeral-storage"] == "200Gi"
    # Stored as the API server stores quantities, so the object read back is no drift.
    c = container(render_all(*render(resources={"ephemeralStorage": 1024})).deployment)
    assert c["resources"]["limits"] == {"ephemeral-storage": "1024"}
    unbounded = container(render_all(*render(backend=backend)).deployment)
    assert "ephemeral-storage" not in json.dumps(unbounded)


def test_no_cpu_limit_and_the_vllm_backend_leave_the_thread_count_alone() -> None:
    unlimited = container(render_all(*render()).deployment)
    vllm = container(render_all(*render(backend="vllm", resources={"cpu": "2"})).deployment)
    for c in (unlimited, vllm):
        assert "OMP_NUM_THREADS" not in {e["name"] for e in c["env"]}


@pytest.mark.parametrize(("model", "field"), [
    ({"name": "chat", "path": "--trust-remote-code"}, "spec.model.path"),
    ({"name": "--admin-port=1"}, "spec.model.name"),
    ({"name": "-x"}, "spec.model.name"),
    ({"name": "chat\n--trust-remote-code"}, "spec.model.name"),
    ({"name": "chat", "path": "/models/a b\x00"}, "spec.model.path"),
    ({"name": "m" * 1000}, "spec.model.name"),
])
@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_a_model_reference_that_would_be_read_as_an_option_is_refused(
        model: dict[str, str], field: str, backend: str) -> None:
    # The reference is the engine's first argument: "--trust-remote-code" there is a
    # flag the image allow-list never meant to allow a tenant to set.
    with pytest.raises(SpecError) as info:
        parse_spec(body(model=model, backend=backend))
    assert any(p.startswith(field) for p in info.value.problems), info.value.problems


def test_ordinary_model_references_pass() -> None:
    for model in ({"name": "meta-llama/Llama-3.1-8B-Instruct"},
                  {"name": "chat", "path": "/models/llama-3.1-8b"},
                  {"name": "Qwen2.5-0.5B", "path": "s3://bucket/qwen-2.5"}):
        assert parse_spec(body(model=model, backend="vllm")).model_ref in model.values()


def test_the_engine_is_given_the_deployments_slo_to_judge_requests_by() -> None:
    """In the ConfigMap it reads at start (an edit reaches running pods by PUT
    /admin/slo: no restart), named by an environment variable, which an image too old
    to read it ignores rather than failing on an unknown flag."""
    from slopilot.engine.slo import SLO_FILE_ENV, SLOSpec

    slo = {"profile": "strict", "classes": {"p1": {"tbtP99Ms": 70}}}
    b, spec = render(slo=slo)
    out = render_all(b, spec)
    assert json.loads(out.config_map["data"]["slo.json"]) == SLOSpec.from_dict(
        slo).to_dict() == spec.slo.to_dict()
    env = {e["name"]: e.get("value") for e in container(out.deployment)["env"]}
    assert env[SLO_FILE_ENV] == "/etc/slopilot/slo.json"
    assert "--slo" not in container(out.deployment)["command"]
    edited = render_all(*render(slo={"profile": "relaxed"}))
    assert checksum(edited) == checksum(out)  # an SLO edit restarts nothing
    vllm = render_all(*render(backend="vllm", slo=slo))
    assert SLO_FILE_ENV not in {e["name"] for e in container(vllm.deployment)["env"]}


def test_both_backends_pods_are_given_the_alert_factors_beside_the_slo() -> None:
    """Every threshold the rules judge (a target times a ``spec.alerts`` factor) is an
    edge of the pods' histograms only if the pods know the factors: a file of its own in
    the ConfigMap (an older image refuses unknown SLO fields), named by a variable (an
    older image ignores it), read at the start only; an edit rolls nothing."""
    from slopilot.engine.alert_factors import ALERTS_FILE_ENV, AlertFactors

    alerts = {"ttftWarningFactor": 1.1, "ttftRetuneFactor": 1.37, "tbtScaleFactor": 3}
    for backend, reader in (("builtin", "engine"), ("vllm", "meter")):
        b, spec = render(backend=backend, alerts=alerts)
        out = render_all(b, spec)
        data = json.loads(out.config_map["data"]["alerts.json"])
        assert AlertFactors.from_dict(data) == AlertFactors(1.1, 1.37, 3.0)
        assert data == {k: float(v) for k, v in alerts.items()}
        (c,) = [c for c in out.deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == reader]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[ALERTS_FILE_ENV] == "/etc/slopilot/alerts.json"
        default = render_all(*render(backend=backend))
        assert AlertFactors.from_dict(json.loads(
            default.config_map["data"]["alerts.json"])) == AlertFactors()
        assert checksum(default) == checksum(out)  # a factor edit restarts nothing
    vllm = render_all(*render(backend="vllm"))
    engine = {e["name"] for e in container(vllm.deployment)["env"]}
    assert ALERTS_FILE_ENV not in engine  # vLLM's own container: the meter reads it


def test_the_twin_reads_its_p99s_through_the_factors_the_pods_are_given() -> None:
    """The twin check predicts P99s as the pods' histograms read them (``twin_predict``):
    its controller gets the factors from the same spec.alerts, through the same
    ``edge_factors``, as the ConfigMap's alerts.json, not the defaults."""
    from slopilot.engine.alert_factors import AlertFactors
    from slopilot.operator.daemon import controller_settings

    for alerts in ({"ttftWarningFactor": 1.1, "ttftRetuneFactor": 1.37,
                    "tbtScaleFactor": 3}, {}):
        b, spec = render(alerts=alerts)
        pods = AlertFactors.from_dict(json.loads(
            render_all(b, spec).config_map["data"]["alerts.json"]))
        assert controller_settings(spec, "team", "chat").alert_factors == pods


# A tenant's CR written as if it were a pod template, to land on reserved GPU nodes, run
# as another account, mount a node's files or give vLLM flags the operator never renders.
POD_FIELDS = {
    "nodeSelector": {"pool": "reserved-h100"}, "nodeName": "gpu-node-7",
    "tolerations": [{"operator": "Exists"}], "affinity": {"nodeAffinity": {}},
    "priorityClassName": "system-node-critical", "runtimeClassName": "unconfined",
    "serviceAccountName": "cluster-admin", "hostNetwork": True, "hostPID": True,
    "securityContext": {"privileged": True, "runAsUser": 0},
    "env": [{"name": "VLLM_ALLOW_INSECURE", "value": "1"}],
    "args": ["--host", "0.0.0.0", "--trust-remote-code"],
    "extraArgs": ["--served-model-name=x", "--api-key=\n--trust-remote-code"],
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
}


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_pod_fields_a_tenant_writes_in_the_spec_reach_no_rendered_object(backend: str
                                                                         ) -> None:
    """The schema has no such field, so the API server prunes them; a CR that comes
    another way (this parse takes any mapping) renders them nowhere either."""
    from slopilot.operator.crd import openapi_schema
    from tests.support.crd_schema import prune

    b, spec = render(backend=backend, **POD_FIELDS)
    stored = prune(openapi_schema(), b)
    assert not set(POD_FIELDS) & set(stored["spec"]), stored["spec"]
    text = json.dumps([o for o in render_all(b, spec).objects()])
    for needle in ("reserved-h100", "gpu-node-7", "Exists", "system-node-critical",
                   "unconfined", "cluster-admin", "hostNetwork", "hostPID", "privileged",
                   "VLLM_ALLOW_INSECURE", "0.0.0.0", "trust-remote-code", "hostPath",
                   "--api-key", "serviceAccountName", "nodeName"):
        assert needle not in text, needle
    pod = render_all(b, spec).deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
