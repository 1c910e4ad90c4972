"""Where an LLMDeployment's pods land and what a node drain may take of them at once:
its PodDisruptionBudget, the default soft spread over nodes, ``spec.scheduling`` (node
selector, tolerations, priority class, under the operator's policy) and
``spec.model.startupTimeout`` (the startup probe's budget)."""

# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import copy
from typing import Any

import kubernetes.client
import kubernetes_validate
import pytest

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.owned_meta import selector
from slopilot.operator.policy import OperatorPolicy, PolicyError, policy_problems
from slopilot.operator.reconcile import (
    Change,
    Refusal,
    desired_objects,
    owned_names,
    reconcile,
)
from slopilot.operator.render import render_all
from slopilot.operator.scheduling import spread_constraint
from slopilot.operator.settings import operator_policy
from slopilot.operator.spec import SpecError, parse_spec
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.operator.test_crd_parity import admitted
from tests.support.kube_server import RunningEmulator

KUBE_VERSION = "1.33.0"
UID = "0b0e9a4e-4c1e-4d55-9b5e-1c9a3f6f0d11"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def body(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": "team", "uid": UID},
            "spec": {"model": {"name": "smollm2-135m"}, **spec}}


def pod_spec(b: dict[str, Any]) -> dict[str, Any]:
    return dict(render_all(b, parse_spec(b)).deployment["spec"]["template"]["spec"])


def problems(**spec: Any) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(body(**spec))
    return caught.value.problems


# --- the PodDisruptionBudget -------------------------------------------------------------

@pytest.mark.parametrize("replicas", [{"min": 1, "max": 1}, {"min": 2, "max": 8}])
def test_every_deployment_has_a_budget_that_lets_a_drain_take_one_pod_at_a_time(
        replicas: dict[str, int]) -> None:
    b = body(replicas=replicas)
    out = render_all(b, parse_spec(b))
    pdb = out.pod_disruption_budget
    assert pdb in out.objects()
    assert pdb["apiVersion"] == "policy/v1" and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["metadata"]["name"] == "chat"
    assert pdb["metadata"]["labels"] == out.deployment["metadata"]["labels"]
    assert pdb["metadata"]["ownerReferences"] == out.deployment["metadata"]["ownerReferences"]
    # maxUnavailable, never minAvailable: at one replica a drain still evicts the pod.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    # Broken pods never hold up a drain of the node they are on.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # The deployment's own pods, as its Deployment selects them, and no one else's.
    assert pdb["spec"]["selector"] == out.deployment["spec"]["selector"]
    kubernetes_validate.validate(pdb, KUBE_VERSION, strict=True)


def test_the_budget_is_one_of_the_objects_the_crs_drift_repair_watches() -> None:
    b = body()
    objects = desired_objects(b, parse_spec(b), replicas=1, monitoring=False,
                              operator_namespace="slopilot-system")
    assert ("PodDisruptionBudget", "chat") in {(o["kind"], o["metadata"]["name"])
                                               for o in objects}
    assert ("PodDisruptionBudget", "chat") in owned_names("chat")


# --- the default spread ------------------------------------------------------------------

def test_replicas_are_spread_over_nodes_softly_counting_only_their_own_pods() -> None:
    spec = pod_spec(body(replicas={"min": 3, "max": 3}))
    [spread] = spec["topologySpreadConstraints"]
    assert spread == {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                      "whenUnsatisfiable": "ScheduleAnyway",
                      "labelSelector": {"matchLabels": selector("chat")}}
    other = pod_spec(body("other"))["topologySpreadConstraints"][0]
    assert other["labelSelector"]["matchLabels"] != spread["labelSelector"]["matchLabels"]
    # Nothing asked for, nothing else placed: the cluster's defaults stand.
    assert not {"nodeSelector", "tolerations", "priorityClassName", "affinity"} & set(spec)


# --- spec.scheduling ---------------------------------------------------------------------

def test_scheduling_fields_reach_the_pod_spec() -> None:
    b = body(scheduling={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                         "tolerations": [GPU_TOLERATION,
                                         {"key": "team", "operator": "Equal",
                                          "value": "ml", "effect": "NoExecute",
                                          "tolerationSeconds": 60}],
                         "priorityClassName": "inference-high"})
    out = render_all(b, parse_spec(b))
    spec = out.deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [GPU_TOLERATION,
                                   {"key": "team", "operator": "Equal", "value": "ml",
                                    "effect": "NoExecute", "tolerationSeconds": 60}]
    assert spec["priorityClassName"] == "inference-high"
    kubernetes_validate.validate(out.deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(("scheduling", "needle"), [
    ({"nodeSelector": {"bad key!": "x"}}, "spec.scheduling.nodeSelector"),
    ({"nodeSelector": {"gpu": "h100 80g"}}, "spec.scheduling.nodeSelector.gpu"),
    ({"nodeSelector": {"gpu": 1}}, "spec.scheduling.nodeSelector.gpu"),
    ({"tolerations": [{"key": "a", "operator": "Sometimes"}]},
     "spec.scheduling.tolerations[0].operator"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
     "spec.scheduling.tolerations[0].value"),
    ({"tolerations": [{"key": "a", "effect": "NoRun"}]},
     "spec.scheduling.tolerations[0].effect"),
    ({"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     "spec.scheduling.tolerations[0].tolerationSeconds"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]},
     "spec.scheduling.tolerations[0].key"),
    ({"tolerations": "nvidia.com/gpu"}, "spec.scheduling.tolerations"),
    ({"priorityClassName": "High_Priority"}, "spec.scheduling.priorityClassName"),
    ({"affinity": {}}, "spec.scheduling.affinity"),
])
def test_a_bad_scheduling_field_is_named_with_its_value_and_fix(
        scheduling: dict[str, Any], needle: str) -> None:
    found = problems(scheduling=scheduling)
    assert any(p.startswith(needle) for p in found), found
    assert all(p.startswith("spec.scheduling") for p in found), found


# --- the operator's policy over spec.scheduling ------------------------------------------

def policy_refuses(policy: OperatorPolicy, **scheduling: Any) -> list[str]:
    return [p for p in policy_problems(parse_spec(body(scheduling=scheduling)), policy,
                                       namespace="team")
            if p.startswith("spec.scheduling")]


def test_no_priority_class_is_allowed_unless_the_administrator_lists_it() -> None:
    [refused] = policy_refuses(OperatorPolicy(), priorityClassName="inference-high")
    assert "inference-high" in refused and "SLOPILOT_ALLOWED_PRIORITY_CLASSES" in refused
    allowed = operator_policy({"SLOPILOT_ALLOWED_PRIORITY_CLASSES": "inference-high, batch"})
    assert policy_refuses(allowed, priorityClassName="inference-high") == []
    assert policy_refuses(allowed, priorityClassName="training") != []


@pytest.mark.parametrize("name", ["system-cluster-critical", "system-node-critical"])
def test_a_system_priority_class_is_refused_even_where_any_is_allowed(name: str) -> None:
    everything = operator_policy({"SLOPILOT_ALLOWED_PRIORITY_CLASSES": "*"})
    assert policy_refuses(everything, priorityClassName="inference-high") == []
    [refused] = policy_refuses(everything, priorityClassName=name)
    assert name in refused and "preempt" in refused
    with pytest.raises(PolicyError, match="SLOPILOT_ALLOWED_PRIORITY_CLASSES"):
        operator_policy({"SLOPILOT_ALLOWED_PRIORITY_CLASSES": f"batch,{name}"})


def test_only_the_gpu_taint_is_tolerated_unless_the_administrator_says_otherwise() -> None:
    default = OperatorPolicy()
    assert policy_refuses(default, tolerations=[GPU_TOLERATION]) == []
    reserved = {"key": "team-b/reserved", "operator": "Exists", "effect": "NoSchedule"}
    [refused] = policy_refuses(default, tolerations=[GPU_TOLERATION, reserved])
    assert refused.startswith("spec.scheduling.tolerations[1]")
    assert "team-b/reserved" in refused and "SLOPILOT_ALLOWED_TOLERATIONS" in refused
    # A toleration without a key tolerates every taint: only "*" allows it.
    anything = {"operator": "Exists"}
    assert policy_refuses(default, tolerations=[anything]) != []
    listed = operator_policy({"SLOPILOT_ALLOWED_TOLERATIONS": "team-b/reserved"})
    assert policy_refuses(listed, tolerations=[reserved]) == []
    assert policy_refuses(listed, tolerations=[GPU_TOLERATION]) != []
    assert policy_refuses(listed, tolerations=[anything]) != []
    none = operator_policy({"SLOPILOT_ALLOWED_TOLERATIONS": ""})
    assert policy_refuses(none, tolerations=[GPU_TOLERATION]) != []
    star = operator_policy({"SLOPILOT_ALLOWED_TOLERATIONS": "*"})
    assert policy_refuses(star, tolerations=[anything, reserved]) == []


@pytest.mark.parametrize("entry", ["Bad_Class", "a b"])
def test_a_bad_priority_class_entry_stops_the_start_naming_the_variable(entry: str) -> None:
    with pytest.raises(PolicyError, match="SLOPILOT_ALLOWED_PRIORITY_CLASSES"):
        operator_policy({"SLOPILOT_ALLOWED_PRIORITY_CLASSES": entry})


# --- spec.model.startupTimeout -----------------------------------------------------------

def startup_probe(b: dict[str, Any]) -> dict[str, Any]:
    return dict(pod_spec(b)["containers"][0]["startupProbe"])


def test_the_startup_budget_is_ten_minutes_unless_the_model_needs_longer() -> None:
    default = startup_probe(body())
    assert default["periodSeconds"] * default["failureThreshold"] == 600
    big = body(backend="vllm", model={"name": "meta-llama/Llama-3.1-70B-Instruct",
                                      "startupTimeout": "45m"})
    probe = startup_probe(big)
    assert probe["periodSeconds"] * probe["failureThreshold"] == 45 * 60
    odd = startup_probe(body(model={"name": "smollm2-135m", "startupTimeout": "95s"}))
    assert odd["periodSeconds"] * odd["failureThreshold"] >= 95  # rounded up, never short
    assert parse_spec(big).startup_timeout_s == 45 * 60


@pytest.mark.parametrize("value", ["10s", "3h", "soon"])
def test_a_startup_timeout_out_of_bounds_is_refused_naming_the_range(value: str) -> None:
    found = problems(model={"name": "m", "startupTimeout": value})
    assert any(p.startswith("spec.model.startupTimeout") for p in found), found


# --- on the API server -------------------------------------------------------------------

def test_the_budget_is_made_kept_and_put_back(kube: RunningEmulator,
                                             kube_client: kubernetes.client.ApiClient
                                             ) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd(replicas={"min": 2, "max": 4},
                                  scheduling={"tolerations": [GPU_TOLERATION]}))
    k = Kube(kube_client)
    policy, mint = OperatorPolicy(), operator_mint(cluster)
    first = reconcile(k, created, policy=policy, mint=mint)
    assert first.changes["PodDisruptionBudget/chat"] is Change.CREATED
    pdb = k.get("policy/v1", "poddisruptionbudgets", NS, "chat")
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert reconcile(k, created, policy=policy, mint=mint).changes["PodDisruptionBudget/chat"] \
        is Change.UNCHANGED
    # A hand edit that would block every drain is put back.
    k.patch("policy/v1", "poddisruptionbudgets", NS, "chat",
            {"spec": {"maxUnavailable": 0}})
    assert reconcile(k, created, policy=policy, mint=mint).changes["PodDisruptionBudget/chat"] \
        is Change.PATCHED
    assert k.get("policy/v1", "poddisruptionbudgets", NS, "chat")["spec"][
        "maxUnavailable"] == 1
    dep = k.get("apps/v1", "deployments", NS, "chat")
    assert dep["spec"]["template"]["spec"]["tolerations"] == [GPU_TOLERATION]
    # Gone with its CR, by the garbage collector, as the other children.
    cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                   "llmdeployments", "chat")
    assert k.get("policy/v1", "poddisruptionbudgets", NS, "chat") is None


def test_a_refused_priority_class_touches_nothing(kube: RunningEmulator,
                                                  kube_client: kubernetes.client.ApiClient
                                                  ) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd(scheduling={"priorityClassName": "inference-high"}))
    out = reconcile(Kube(kube_client), copy.deepcopy(created), policy=OperatorPolicy(),
                    mint=operator_mint(cluster))
    assert not out.valid and out.refusal is Refusal.NOT_ALLOWED and out.changes == {}
    assert any("inference-high" in p for p in out.problems)
    assert Kube(kube_client).get("apps/v1", "deployments", NS, "chat") is None


def test_the_api_server_refuses_a_system_priority_class_at_apply() -> None:
    _, errors = admitted({"scheduling": {"priorityClassName": "system-cluster-critical"}})
    assert any(e.startswith("spec.scheduling.priorityClassName") and "preempt" in e
               for e in errors), errors


# --- what the render drops is taken off the live objects --------------------------------

def _template(k: Kube) -> dict[str, Any]:
    return dict(k.get("apps/v1", "deployments", NS, "chat")["spec"]["template"]["spec"])


def test_a_revoked_priority_class_and_a_node_label_taken_out_leave_the_pods(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd(scheduling={"nodeSelector": {"team": "a", "gpu": "h100"},
                                              "priorityClassName": "inference-high"}))
    k, mint = Kube(kube_client), operator_mint(cluster)
    allowing = OperatorPolicy(allowed_priority_classes=("inference-high",))
    assert reconcile(k, created, policy=allowing, mint=mint).valid
    assert _template(k)["priorityClassName"] == "inference-high"
    # The administrator revokes the class; the tenant takes it (and a label) out.
    edited = k.patch(created["apiVersion"], "llmdeployments", NS, "chat", {"spec": {
        "scheduling": {"priorityClassName": None, "nodeSelector": {"team": None}}}})
    out = reconcile(k, edited, policy=OperatorPolicy(), mint=mint)
    assert out.valid and out.changes["Deployment/chat"] is Change.PATCHED
    pod = _template(k)
    assert "priorityClassName" not in pod
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert reconcile(k, edited, policy=OperatorPolicy(), mint=mint).changes[
        "Deployment/chat"] is Change.UNCHANGED


def test_removing_spec_scheduling_takes_every_placement_field_off_the_pods(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd(scheduling={"nodeSelector": {"team": "a"},
                                              "priorityClassName": "inference-high",
                                              "tolerations": [GPU_TOLERATION]}))
    k, mint = Kube(kube_client), operator_mint(cluster)
    policy = OperatorPolicy(allowed_priority_classes=("inference-high",))
    assert reconcile(k, created, policy=policy, mint=mint).valid
    edited = k.patch(created["apiVersion"], "llmdeployments", NS, "chat",
                     {"spec": {"scheduling": None}})
    assert reconcile(k, edited, policy=policy, mint=mint).valid
    pod = _template(k)
    assert not {"nodeSelector", "priorityClassName", "tolerations"} & set(pod), pod
    assert pod["topologySpreadConstraints"] == [spread_constraint(selector("chat"))]


def test_placement_added_by_hand_is_drift_and_taken_off(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd(scheduling={"nodeSelector": {"gpu": "h100"}}))
    k, policy, mint = Kube(kube_client), OperatorPolicy(), operator_mint(cluster)
    assert reconcile(k, created, policy=policy, mint=mint).valid
    # Fields the API server fills are another writer's, and are left as they are.
    defaults = {"schedulerName": "default-scheduler", "dnsPolicy": "ClusterFirst",
                "terminationGracePeriodSeconds": 30}
    k.patch("apps/v1", "deployments", NS, "chat", {"spec": {"template": {"spec": defaults}}})
    assert reconcile(k, created, policy=policy, mint=mint).changes["Deployment/chat"] \
        is Change.UNCHANGED
    k.patch("apps/v1", "deployments", NS, "chat", {"spec": {"template": {"spec": {
        "priorityClassName": "system-cluster-critical", "nodeSelector": {"team": "b"},
        "tolerations": [{"operator": "Exists"}], "topologySpreadConstraints": None}}}})
    assert reconcile(k, created, policy=policy, mint=mint).changes["Deployment/chat"] \
        is Change.PATCHED
    pod = _template(k)
    assert not {"priorityClassName", "tolerations"} & set(pod), pod
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["topologySpreadConstraints"] == [spread_constraint(selector("chat"))]
    assert {key: pod[key] for key in defaults} == defaults


def test_a_budget_edited_to_min_available_is_put_back(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    created = cluster.create(llmd())
    k, policy, mint = Kube(kube_client), OperatorPolicy(), operator_mint(cluster)
    assert reconcile(k, created, policy=policy, mint=mint).valid
    # An edit that blocks every drain; policy/v1 refuses both fields set (422), so the
    # repair must take minAvailable off as it puts maxUnavailable back.
    k.patch("policy/v1", "poddisruptionbudgets", NS, "chat",
            {"spec": {"maxUnavailable": None, "minAvailable": "100%"}})
    out = reconcile(k, created, policy=policy, mint=mint)
    assert out.valid, out.problems
    assert out.changes["PodDisruptionBudget/chat"] is Change.PATCHED
    spec = k.get("policy/v1", "poddisruptionbudgets", NS, "chat")["spec"]
    assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec


def test_the_emulator_refuses_a_budget_with_both_fields_as_the_api_server_does(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    k = Kube(kube_client)
    with pytest.raises(ApiError) as refused:
        k.create("policy/v1", "poddisruptionbudgets", NS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "both", "namespace": NS},
            "spec": {"minAvailable": 1, "maxUnavailable": 1,
                     "selector": {"matchLabels": {"app": "x"}}}})
    assert refused.value.status == 422
    assert "minAvailable and maxUnavailable cannot be both set" in refused.value.message
