"""A vLLM pod's meter: the proxy in front of vLLM that judges each streamed request.

vLLM exports no per-request SLO verdicts, so a vLLM deployment's goodput was the product
of its histograms' shares, which read 81 % of P0's tokens good on mixed traffic where
13.5 % were (docs/benchmarks.md, ``mixed_p0_product_err``). The meter (``slopilot meter``, the
operator's own image) takes the pod's ``http`` port, forwards to vLLM on the loopback,
judges each stream as its client sees it and serves vLLM's /metrics followed by its
verdicts, so the Service, the ServiceMonitor and the NetworkPolicy keep the port they had.
Only the rendering is tested here.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import kubernetes_validate
import pytest
from kubernetes.utils import parse_quantity

from slopilot.operator.engine_deployment import CHECKSUM_ANNOTATION, vllm_args
from slopilot.operator.images import DEFAULT_IMAGES
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.render import render_all
from slopilot.operator.spec import Backend, parse_spec

UID = "0b0e9a4e-4c1e-4d55-9b5e-1c9a3f6f0d11"


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": UID},
            "spec": {"model": {"name": "smollm2-135m", "path": "/models/smollm2"}, **spec}}


def vllm(**spec: Any) -> Any:
    b = body(backend="vllm", **spec)
    return render_all(b, parse_spec(b))


def pod(out: Any) -> dict[str, Any]:
    return dict(out.deployment["spec"]["template"]["spec"])


def containers(out: Any) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod(out)["containers"]}


def test_the_meter_takes_the_pods_port_and_forwards_to_vllm_on_the_loopback() -> None:
    out = vllm(slo={"vllmClass": "p1"})
    engine, meter = pod(out)["containers"]  # the engine first: kubectl's default container
    assert (engine["name"], meter["name"]) == ("engine", "meter")
    assert meter["command"] == [
        "slopilot", "meter", "--upstream", "http://127.0.0.1:8001", "--port", "8000",
        "--slo-file", "/etc/slopilot/slo.json", "--priority-class", "p1",
        "--max-body-mb", "16", "--body-budget-mb", "64"]
    assert "args" not in meter
    assert meter["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert engine["ports"] == [{"name": "vllm", "containerPort": 8001, "protocol": "TCP"}]
    args = vllm_args(parse_spec(body(backend="vllm")))[0]
    assert dict(itertools.pairwise(args))["--port"] == "8001"
    # The kubelet probes vLLM on the pod's IP: it keeps listening on every interface.
    assert "--host" not in args
    assert engine["args"] == args


def test_the_meter_judges_in_the_class_vllms_series_are_relabelled_into() -> None:
    for slo, cls in (({}, "p0"), ({"vllmClass": "p2"}, "p2")):
        out = vllm(slo=slo)
        command = containers(out)["meter"]["command"]
        assert command[command.index("--priority-class") + 1] == cls
        relabel = out.service_monitor["spec"]["endpoints"][0]["metricRelabelings"][-1]
        assert relabel["replacement"] == cls


def test_the_meter_runs_the_operators_image_whatever_the_tenant_chose() -> None:
    out = vllm(image="registry.acme.internal/vllm:custom")
    assert containers(out)["engine"]["image"] == "registry.acme.internal/vllm:custom"
    assert containers(out)["meter"]["image"] == DEFAULT_IMAGES[Backend.BUILTIN]


def test_the_image_allow_list_judges_the_tenants_image_not_the_meters() -> None:
    # The allow-list says which images a tenant may run; the meter is the operator's own
    # code, chosen by the operator: a list without the slopilot image refuses nothing here.
    only_vllm = OperatorPolicy(allowed_images=("docker.io/vllm/vllm-openai",))
    assert not only_vllm.image_allowed(DEFAULT_IMAGES[Backend.BUILTIN])
    assert policy_problems(parse_spec(body(backend="vllm")), only_vllm,
                           namespace="default") == []


def test_the_meter_reads_the_slo_from_the_configmap_mounted_whole() -> None:
    out = vllm(slo={"profile": "strict"})
    assert json.loads(out.config_map["data"]["slo.json"]) == parse_spec(
        body(backend="vllm", slo={"profile": "strict"})).slo.to_dict()
    config = out.config_map["metadata"]["name"]
    (volume,) = [v for v in pod(out)["volumes"] if "configMap" in v]
    assert volume["configMap"] == {"name": config}
    meter = containers(out)["meter"]
    # The directory, not a subPath: the kubelet never updates a subPath mount, and the
    # meter's reload of an edited SLO is what spares vLLM's pods a roll.
    (mount,) = [m for m in meter["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/etc/slopilot", "readOnly": True}
    # The tenant's vLLM image does not see it.
    assert all(m["name"] != volume["name"] for m in containers(out)["engine"]["volumeMounts"])


def test_vllms_probes_go_to_vllm_and_the_meters_only_open_a_connection() -> None:
    c = containers(vllm())
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c["engine"][probe]["httpGet"] == {"path": "/health", "port": "vllm"}
    # The meter's /health is vLLM's, proxied: an HTTP probe would restart the meter
    # while vLLM loads its model.
    for probe in ("readinessProbe", "livenessProbe"):
        assert c["meter"][probe]["tcpSocket"] == {"port": "http"}
        assert "httpGet" not in c["meter"][probe]


def test_the_meter_is_as_locked_down_as_the_engine() -> None:
    c = containers(vllm())
    assert c["meter"]["securityContext"] == c["engine"]["securityContext"]
    assert c["meter"]["securityContext"]["readOnlyRootFilesystem"] is True
    # A writable /tmp of its own: not shared with the tenant's vLLM image.
    tmp = {m["mountPath"]: m["name"] for m in c["meter"]["volumeMounts"]}["/tmp"]
    assert tmp not in {m["name"] for m in c["engine"]["volumeMounts"]}
    assert {"name": tmp, "emptyDir": {}} in pod(vllm())["volumes"]


def qos_class(pod_spec: dict[str, Any]) -> str:
    """The pod's QoS class by Kubernetes' documented rule (concepts/workloads/pods/
    pod-qos): Guaranteed iff every container has CPU and memory limits, with requests
    equal to them (a request left out defaults to its limit); BestEffort iff none has
    any CPU or memory request or limit; else Burstable."""
    guaranteed, best_effort = True, True
    for c in pod_spec["containers"]:
        resources = c.get("resources") or {}
        limits = {k: v for k, v in (resources.get("limits") or {}).items()
                  if k in ("cpu", "memory")}
        requests = {**limits, **{k: v for k, v in (resources.get("requests") or {}).items()
                                 if k in ("cpu", "memory")}}
        best_effort = best_effort and not limits and not requests
        guaranteed = guaranteed and set(limits) == {"cpu", "memory"} and all(
            parse_quantity(requests[k]) == parse_quantity(limits[k]) for k in limits)
    return "Guaranteed" if guaranteed else "BestEffort" if best_effort else "Burstable"


def test_the_qos_rule_of_the_test_is_kubernetes_own() -> None:
    def pod_of(*resources: dict[str, Any]) -> dict[str, Any]:
        return {"containers": [{"name": str(i), "resources": r}
                               for i, r in enumerate(resources)]}

    whole = {"limits": {"cpu": "1", "memory": "1Gi"}}
    assert qos_class(pod_of(whole)) == "Guaranteed"  # requests default to the limits
    assert qos_class(pod_of({"requests": {"cpu": "1000m", "memory": "1024Mi"}, **whole}))\
        == "Guaranteed"
    assert qos_class(pod_of(whole, {"requests": {"cpu": "1", "memory": "1Gi"},
                                    "limits": {"memory": "1Gi"}})) == "Burstable"
    assert qos_class(pod_of({"limits": {"nvidia.com/gpu": 1}}, {})) == "BestEffort"


GUARANTEED_ENGINE = {"gpu": 1, "cpu": "4", "memory": "32Gi"}
BURSTABLE_ENGINES = [{}, {"gpu": 1}, {"gpu": 1, "cpu": "4"}, {"memory": "32Gi"}]


def test_a_pod_whose_engine_is_guaranteed_stays_guaranteed_with_its_meter() -> None:
    # A GPU pod evicted early under node pressure (Burstable goes before Guaranteed)
    # loses its loaded model: the meter must not demote the pod the user sized whole.
    out = vllm(resources=GUARANTEED_ENGINE)
    assert qos_class(pod(out)) == "Guaranteed"
    assert containers(out)["meter"]["resources"] == {
        "requests": {"cpu": "500m", "memory": "256Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"}}
    kubernetes_validate.validate(out.deployment, "1.33.0", strict=True)


@pytest.mark.parametrize("resources", BURSTABLE_ENGINES)
def test_otherwise_the_meter_requests_a_cpu_share_and_is_never_throttled(
        resources: dict[str, Any]) -> None:
    out = vllm(resources=resources)
    assert qos_class(pod(out)) == "Burstable"
    assert containers(out)["meter"]["resources"] == {
        "requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}


def test_only_the_meter_is_reachable_from_other_pods() -> None:
    out = vllm()
    named = [(c["name"], p["containerPort"]) for c in pod(out)["containers"]
             for p in c["ports"] if p["name"] == "http"]
    assert named == [("meter", 8000)]
    assert out.service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert out.service_monitor["spec"]["endpoints"][0]["port"] == "http"
    # vLLM's port is in no rule: other pods cannot reach it past the meter (the kubelet's
    # probes come from the node, which a NetworkPolicy always admits).
    [rule] = out.network_policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}] and rule["from"]


def checksum(out: Any) -> str:
    return str(out.deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION])


def test_an_slo_edit_rolls_no_vllm_pod_but_a_new_class_does() -> None:
    before = vllm(slo={"profile": "standard"})
    # The objectives only: a profile also picks the engine's preset knobs.
    edited = vllm(slo={"profile": "standard", "classes": {"p0": {"tbtP99Ms": 40}}})
    assert edited.config_map != before.config_map  # the meter re-reads the file
    assert edited.deployment["spec"]["template"] == before.deployment["spec"]["template"]
    reclassed = vllm(slo={"profile": "standard", "vllmClass": "p1"})
    assert reclassed.config_map == before.config_map
    assert checksum(reclassed) != checksum(before)


def test_a_vllm_pod_with_its_meter_validates_against_kubernetes() -> None:
    out = vllm(resources={"gpu": 1, "cpu": "1500m", "memory": "8Gi"})
    kubernetes_validate.validate(out.deployment, "1.33.0", strict=True)


def test_the_builtin_engines_objects_are_as_they_were_before_the_meter() -> None:
    """Byte for byte: a changed template rolls every built-in pod. A change meant for the
    built-in engine updates the digest and says so in its commit."""
    outs = []
    for spec, kw in (({}, {}),
                     ({"resources": {"gpu": 1, "cpu": "1500m", "memory": "8Gi"},
                       "slo": {"profile": "strict"}, "engine": {"blockSize": 32}},
                      {"admin_token_sha256": "ab" * 32, "operator_namespace": "ops",
                       "replicas": 3})):
        b = body(**spec)
        out = render_all(b, parse_spec(b), **kw)
        outs.append({"objects": out.objects(), "unsupported": list(out.unsupported_knobs)})
    text = json.dumps(outs, sort_keys=True)
    # Last changed by the alert factors' file (the ConfigMap's alerts.json and the
    # engine's $SLOPILOT_ALERTS_FILE, alert_factors.py: the template changed, so every
    # built-in pod rolls once at that upgrade). Before it, 6366c088... (the
    # ServiceMonitor's scrape limits and its pod-backed relabelings (scrape_limits.py,
    # service_monitor.pod_backed_relabelings), which roll no pod). Before them,
    # 519354e3... (the NetworkPolicy's http rule naming its sources (the namespace,
    # Prometheus), which rolls no pod). Before it, e6ade53a... (the PodDisruptionBudget,
    # the pod template's soft spread over nodes, and the Deployment's rolling strategy
    # and progress deadline: the template changed, so every built-in pod rolled once at
    # that upgrade); before them, 42fc0472... (the ServiceMonitor's drops of not-ready
    # endpoints, which rolled no pod).
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "56de42a0dbde1107e738154e553f21d5158890eae0f65e8dbd2c9028704cebcc")


def test_the_rendered_meter_command_is_one_the_image_s_cli_takes() -> None:
    """The render and ``slopilot meter`` are written apart: a flag renamed on one side
    would crash-loop every vLLM pod's meter."""
    from slopilot.cli import build_parser
    from slopilot.engine.meter.commands import run

    command = containers(vllm(slo={"vllmClass": "p2"}))["meter"]["command"]
    assert command[0] == "slopilot"
    args = build_parser().parse_args(command[1:])
    assert args.func is run
    assert (args.upstream, args.port, str(args.slo_file), args.priority_class) == (
        "http://127.0.0.1:8001", 8000, "/etc/slopilot/slo.json", "p2")


def test_the_meters_body_limits_are_sized_from_its_memory_limit() -> None:
    """One source for the memory the meter is given and the bodies it may hold: raised
    on one side alone, bodies within the cap could take the meter past its limit (an
    OOM kill drops every stream of the pod) or the cap would refuse what fits."""
    from slopilot.engine.meter.body_budget import (
        BODY_BUDGET_MIB,
        MAX_BODY_MIB,
        METER_MEMORY_MIB,
        limits_within,
    )

    meter = containers(vllm())["meter"]
    memory = meter["resources"]["limits"]["memory"]
    assert parse_quantity(memory) == METER_MEMORY_MIB << 20
    assert limits_within(METER_MEMORY_MIB) == (MAX_BODY_MIB, BODY_BUDGET_MIB)
    command = meter["command"]
    assert command[command.index("--max-body-mb") + 1] == str(MAX_BODY_MIB)
    assert command[command.index("--body-budget-mb") + 1] == str(BODY_BUDGET_MIB)
