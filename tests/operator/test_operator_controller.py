"""The controller daemon over real HTTP: alerts make it scale or retune, once, with status."""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None until they appear.
# mypy: disable-error-code="attr-defined,index,union-attr,arg-type"

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.owned_meta import selector
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from tests.operator.deployment_standin import DeploymentStandIn
from tests.operator.operator_support import (
    NS,
    Cluster,
    add_pod,
    llmd,
    operator,
    operator_mint,
    operator_token,
    pods_up,
    replica_set,
    wait_for,
    wait_steady,
)
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.support.kube_authz import Attributes, allows, granted_to
from tests.support.kube_server import RunningEmulator

RBAC = Path(__file__).parents[2] / "manifests" / "rbac.yaml"


def scale_count(cluster: Cluster) -> int:
    return len(cluster.events("Scale"))


Call = tuple[str | None, str, str, str, str | None]  # namespace, group, resource, verb, name


def ungranted(calls: set[Call]) -> list[Call]:
    """The calls rbac.yaml's bindings do not grant the operator's account, as the API
    server's authorizer would judge (kube_authz.py)."""
    rules = granted_to(yaml.safe_load_all(RBAC.read_text()), DEFAULT_OPERATOR_NAMESPACE,
                       "slopilot-operator")
    return sorted((c for c in calls if not allows(rules, Attributes(*c))), key=str)


def operator_calls(kube: RunningEmulator) -> set[Call]:
    """Every resource call kopf or our client made, with its namespace and object name."""
    out = set()
    for r in list(kube.emulator._requests):
        agent = r.headers.get("User-Agent", "")
        if r.resource is None or not r.resource.plural or not agent.startswith(
                ("kopf/", "slopilot-operator")):
            continue
        plural = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update",
                "DELETE": "delete"}.get(r.method.value)
        if verb is None:
            verb = "watch" if r.params.get("watch") in ("true", "1") else (
                "get" if r.name else "list")
        out.add((r.namespace, r.resource.group or "", plural, verb, r.name))
    return out


def test_scale_alert_scales_once_and_a_restart_does_not_scale_again(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    spec: dict[str, Any] = {"replicas": {"min": 1, "max": 8}, "prometheus": {"url": prom.url}}
    with DeploymentStandIn(cluster), operator(kube_login):
        cluster.create(llmd(**spec))
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"), what="Deployment")
        wait_steady(cluster, "the controller ticking in steady state")
        prom.fire("SlopilotTBTP99High", "scale", "chat", NS)
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat")["spec"][
            "replicas"] == 3, what="scale 1 -> 3")
        status = wait_for(lambda: (s := cluster.status()).get("lastAction") and s,
                          what="lastAction")
        assert status["lastAction"]["action"] == "scale"
        assert "scale_up 1->3" in status["lastAction"]["reason"]
        wait_for(lambda: cluster.status()["controller"]["state"] == "cooldown",
                 what="cooldown persisted")
        wait_for(lambda: scale_count(cluster) == 1, what="one Scale event")
        # The three pods serve (the stand-in made them): the wait for them ended.
        wait_for(lambda: cluster.status().get("readyReplicas") == 3, what="3 ready")
        wait_for(lambda: cluster.condition("Tuning")["message"] == "cooling down",
                 what="the wait for the replicas over")
    calls = operator_calls(kube_login)

    # A new operator process, the alert still firing: it resumes the cooldown.
    with DeploymentStandIn(cluster), operator(kube_login):
        before = cluster.status()["controller"]["since"]
        wait_for(lambda: cluster.condition("Tuning")["message"] == "cooling down"
                 and cluster.status()["controller"]["since"] == before,
                 what="the restarted daemon to tick from the persisted state")
        seen = cluster.condition("Tuning")["lastTransitionTime"]
        wait_for(lambda: cluster.status()["controller"]["reason"] and
                 cluster.condition("Tuning")["lastTransitionTime"] == seen, what="ticks")
        assert cluster.owned("apps/v1", "deployments", "chat")["spec"]["replicas"] == 3
        assert scale_count(cluster) == 1
    missing = ungranted(operator_calls(kube_login) | calls)
    assert not missing, f"the operator made calls rbac.yaml does not grant: {missing}"
    # Its own key, in its own namespace: no Secret anywhere else is read or written.
    secrets = {c for c in calls if c[2] == "secrets"}
    assert secrets <= {("slopilot-system", "", "secrets", "get", "slopilot-operator-token-key"),
                       ("slopilot-system", "", "secrets", "create", None)}


def test_a_scale_the_quota_refuses_is_waited_for_said_and_not_bought_again(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quota admits one pod; the scale alert asks for three. The status tells the
    three asked from the one ready, the wait ends in an inform naming the quota that
    gives the two that never served back (the Deployment asks the one that serves), and
    the alert still firing buys nothing more."""
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY",
                       "tests.operator.standins:build_quick_controller")
    with DeploymentStandIn(cluster, quota=1) as pods, operator(kube_login):
        cluster.create(llmd(replicas={"min": 1, "max": 8}, prometheus={"url": prom.url}))
        wait_for(lambda: cluster.status().get("readyReplicas") == 1, what="one pod ready")
        wait_steady(cluster)
        prom.fire("SlopilotTBTP99High", "scale", "chat", NS)
        wait_for(lambda: pods.refused, what="the quota refusing the scale's pods")
        said = wait_for(lambda: (a := cluster.status().get("lastAction")) and a["action"]
                        == "inform" and a, what="the inform past replica_ready_s")
        assert "replicas_not_ready: 1 of 3 replicas ready" in said["reason"]
        assert "exceeded quota: gpu-quota" in said["reason"]
        assert "2 that never served given back (scaled 3->1)" in said["reason"]
        held = wait_for(lambda: "no scale_up" in (m := cluster.condition("Tuning")[
            "message"]) and m, what="the scale alert held")
        assert "exceeded quota" in held and "SlopilotTBTP99High" in held
        status = cluster.status()
        assert (status["replicas"], status["readyReplicas"]) == (1, 1)
        assert cluster.owned("apps/v1", "deployments", "chat")["spec"]["replicas"] == 1
        wait_for(lambda: not pods.refused, what="no pod refused once given back")
        assert scale_count(cluster) == 1
        assert len(pods.pods) == 1
        # Tuning off: the reconcile keeps the count the daemon kept (the one that serves).
        cluster.patch("chat", {"spec": {"tuning": {"enabled": False}}})
        wait_for(lambda: cluster.condition("Tuning")["reason"] == "Disabled",
                 what="tuning off")
        assert cluster.status().get("readyReplicas") == 1


def test_the_ready_count_follows_the_pods_while_tuning_is_off(
        kube_login: RunningEmulator, cluster: Cluster, controller_env: None) -> None:
    """No daemon runs, and ``kubectl get`` still shows the pods that serve: the quota
    admits one of the two asked, then is raised."""
    with DeploymentStandIn(cluster, quota=1) as pods, operator(kube_login):
        cluster.create(llmd(replicas={"min": 2, "max": 2}, tuning={"enabled": False}))
        wait_for(lambda: (s := cluster.status()).get("replicas") == 2
                 and s.get("readyReplicas") == 1, what="2 asked, 1 ready")
        pods.quota = None
        wait_for(lambda: cluster.status().get("readyReplicas") == 2, what="both ready")


def test_retune_alert_puts_the_trial_on_the_canary_then_commits_to_all(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    pods = [PodStandIn(), PodStandIn()]
    with serving(*pods), operator(kube_login):
        cluster.create(llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                            tuning={"window": "1s", "canary": True}))
        pods_up(cluster, pods)
        wait_steady(cluster)
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        wait_for(lambda: cluster.events("Commit"), what="the commit")
        canary, other = pods[0].put_bodies(), pods[1].put_bodies()
        # The trial went to the canary alone; the commit to both, each with the token.
        assert [b["token_budget"] for b in canary] == [512, 512]
        assert [b["token_budget"] for b in other] == [512]
        assert {auth for p in pods for _, auth in p.puts} == {f"Bearer {pods[0].token}"}
        cm = cluster.owned("v1", "configmaps", "chat-engine")
        assert json.loads(cm["data"]["engine.json"])["token_budget"] == 512
        status = cluster.status()
        assert status["tunedConfig"]["engine"]["chunk_size"] == 256
        assert status["config"]["tokenBudget"] == 512
        assert status["bestTrial"]["config"] == {"token_budget": 512, "chunk_size": 256}
        trial = cluster.events("Trial")[0].message
        assert "on canary" in trial and "retune: alert SlopilotTTFTP99High" in trial
        missing = ungranted(operator_calls(kube_login))
        assert not missing, f"calls rbac.yaml does not grant: {missing}"


def handle_for(cluster: Cluster) -> KubeDeploymentHandle:
    """The CR reconciled once (its Deployment exists) and a handle over it."""
    policy = OperatorPolicy()
    mint = operator_mint(cluster)
    reconcile(cluster.kube, cluster.get("chat"), policy=policy, mint=mint)
    return KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=policy)


def test_the_token_goes_only_to_pods_the_deployments_replica_sets_made(
        kube: RunningEmulator, cluster: Cluster) -> None:
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    cluster.create(llmd(replicas={"min": 1, "max": 2}))
    handle = handle_for(cluster)
    rs = replica_set(cluster, "chat")
    forged = [PodStandIn(), PodStandIn(), PodStandIn(), PodStandIn()]
    with serving(*forged):
        # What anyone who may create pods in the namespace can copy: the labels, an owner
        # reference to the real ReplicaSet (without the controller's blockOwnerDeletion),
        # or one to a ReplicaSet of their own with the same labels.
        add_pod(cluster, "chat", 0, forged[0].port, owner={})
        add_pod(cluster, "chat", 1, forged[1].port, owner={
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
            "uid": rs["metadata"]["uid"], "controller": True})
        own = cluster.kube.create("apps/v1", "replicasets", NS, {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "mine", "labels": rs["metadata"]["labels"]},
            "spec": {"selector": {"matchLabels": rs["metadata"]["labels"]}, "template": {
                "metadata": {"labels": rs["metadata"]["labels"]},
                "spec": {"containers": [{"name": "engine", "image": "x"}]}}}})
        add_pod(cluster, "chat", 2, forged[2].port, owner={
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "mine",
            "uid": own["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True})
        # The real ReplicaSet, but not this template's hash (labels forged on a pod).
        add_pod(cluster, "chat", 3, forged[3].port, labels=selector("chat"))
        assert handle.pods() == []
        with pytest.raises(ApplyError, match="no ready pod of this deployment"):
            handle.apply_config({"token_budget": 512}, canary=True)
    assert all(p.puts == [] for p in forged)


def test_a_pod_with_another_token_says_so_and_a_bad_config_never_leaves(
        kube: RunningEmulator, cluster: Cluster) -> None:
    from slopilot.engine.config import ConfigError
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    cluster.create(llmd(replicas={"min": 1, "max": 2}))
    handle = handle_for(cluster)
    pod = PodStandIn("a-token-someone-else-chose")
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        # To every replica: the one pod is no canary (a canary needs another beside it).
        with pytest.raises(ApplyError, match=r"HTTP 401.*SLOPILOT_ADMIN_TOKEN_SHA256"):
            handle.apply_config({"token_budget": 512}, canary=False)
        assert pod.puts[-1][1] == f"Bearer {operator_token(cluster)}"
        with pytest.raises(ConfigError, match="block_size cannot change on a running engine"):
            handle.apply_config({"block_size": 32}, canary=False)
        assert len(pod.puts) == 1  # the refused config never left the operator


def test_the_canary_is_chosen_once_and_kept_until_a_config_goes_to_all(
        kube: RunningEmulator, cluster: Cluster) -> None:
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    cluster.create(llmd(replicas={"min": 2, "max": 3}))
    handle = handle_for(cluster)
    pods = [PodStandIn(operator_token(cluster)) for _ in range(3)]
    with serving(*pods):
        add_pod(cluster, "chat", 5, pods[0].port)
        add_pod(cluster, "chat", 7, pods[1].port)
        assert handle.apply_config({"token_budget": 512}, canary=True) == "chat-pod-5"
        # A pod that sorts first appears mid-trial: the trial stays where it began.
        add_pod(cluster, "chat", 1, pods[2].port)
        assert handle.apply_config({"token_budget": 1024}, canary=True) == "chat-pod-5"
        assert handle.canary_pod() == "chat-pod-5"
        assert handle.apply_config({"token_budget": 1024}, canary=False) is None
        assert handle.canary_pod() is None
        assert [len(p.puts) for p in pods] == [3, 1, 1]
        # A restarted operator (a fresh handle) finds it in the running trial.
        cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat", {
            "status": {"controller": {"trial": {"canary_replica": "chat-pod-7"}}}},
            subresource="status")
        fresh = KubeDeploymentHandle(cluster.kube, NS, "chat", mint=handle.mint)
        assert fresh.apply_config({"token_budget": 512}, canary=True) == "chat-pod-7"


def test_a_deleted_crs_controller_never_configures_its_successor(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """The handle of a CR deleted and made again under the same name (its daemon's last
    tick still running) read the successor by name, sent its config to the successor's
    pods with the successor's token, and wrote the successor's status.tunedConfig."""
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    first = cluster.create(llmd())
    policy, mint = OperatorPolicy(), operator_mint(cluster)
    reconcile(cluster.kube, first, policy=policy, mint=mint)
    old = KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=policy,
                               uid=first["metadata"]["uid"])
    cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                   "llmdeployments", "chat")
    second = cluster.create(llmd())
    assert reconcile(cluster.kube, second, policy=policy, mint=mint).valid
    pod = PodStandIn(mint.for_body(second))
    with serving(pod):
        add_pod(cluster, "chat", 0, pod.port)
        with pytest.raises(ApplyError, match="is gone"):
            old.apply_config({"token_budget": 512}, canary=False)
    assert pod.puts == []
    assert "tunedConfig" not in cluster.status()


def _has_series(name: str) -> bool:
    from slopilot.operator.daemon import operator_metrics

    registry = operator_metrics(NS).registry
    return registry.get_sample_value(
        "slopilot_replicas", {"slopilot_namespace": NS, "slopilot_deployment": name}) \
        is not None


def test_a_deleted_crs_ending_leaves_its_successors_series_alone(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The series are labelled by namespace and name. A deleted CR's daemon that ended
    after a successor of the same name had started (its study's deletion can take a
    while) removed the successor's series with its own: the new chat's counters went
    back to zero and its gauges vanished until its next tick."""
    from slopilot.operator.crd import crd_manifest
    from slopilot.operator.daemon import operator_metrics
    from slopilot.tuner.loop.state import ControllerState
    from tests.operator.operator_support import daemon_loop

    kube.install(crd_manifest())
    first = cluster.create(llmd())
    old = daemon_loop(cluster, first, monkeypatch)
    cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                   "llmdeployments", "chat")
    cluster.create(llmd())
    operator_metrics(NS).observe("chat", ControllerState.STEADY, 2)  # the successor's
    old.retire()
    assert _has_series("chat")
    # With no successor the ending CR's series go, as before.
    cluster.custom.delete_namespaced_custom_object("slopilot.dev", "v1alpha1", NS,
                                                   "llmdeployments", "chat")
    old.retire()
    assert not _has_series("chat")
