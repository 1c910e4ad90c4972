"""The controller daemon over real HTTP: alerts make it scale or retune, once, with status."""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None until they appear.
# mypy: disable-error-code="attr-defined,index,union-attr,arg-type"

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from slopilot.operator.kube_handle import PORT_ANNOTATION, ApplyError, KubeDeploymentHandle
from slopilot.operator.render import selector
from tests.operator.operator_support import NS, Cluster, llmd, operator, wait_for
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.support.kube_server import RunningEmulator

TOKEN = "s3cret-admin-token"
RBAC = Path(__file__).parents[2] / "manifests" / "rbac.yaml"


@pytest.fixture
def controller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY", "tests.operator.standins:build_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.2")


@pytest.fixture
def prom() -> Iterator[PrometheusStandIn]:
    p = PrometheusStandIn()
    with serving(p):
        yield p


@pytest.fixture
def cluster(kube_client: kubernetes.client.ApiClient) -> Cluster:
    return Cluster(kube_client)


def add_secret(cluster: Cluster, name: str = "chat-admin", token: str = TOKEN) -> None:
    cluster.core.create_namespaced_secret(NS, {
        "metadata": {"name": name},
        "data": {"token": base64.b64encode(token.encode()).decode()}})


def add_pod(cluster: Cluster, deployment: str, index: int, pod: PodStandIn) -> None:
    """A ready engine pod whose admin endpoint is the stand-in on 127.0.0.1."""
    name = f"{deployment}-pod-{index}"
    cluster.core.create_namespaced_pod(NS, {
        "metadata": {"name": name, "labels": selector(deployment),
                     "annotations": {PORT_ANNOTATION: str(pod.port)}},
        "spec": {"containers": [{"name": "engine", "image": "x"}]}})
    cluster.core.patch_namespaced_pod_status(name, NS, {"status": {
        "phase": "Running", "podIP": "127.0.0.1",
        "conditions": [{"type": "Ready", "status": "True"}]}})


def scale_count(cluster: Cluster) -> int:
    return len(cluster.events("Scale"))


def rbac_grants() -> set[tuple[str, str, str]]:
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ClusterRole")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def operator_calls(kube: RunningEmulator) -> set[tuple[str, str, str]]:
    """(group, resource[/sub], verb) of every resource call kopf or our client made."""
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
        out.add((r.resource.group or "", plural, verb))
    return out


def test_scale_alert_scales_once_and_a_restart_does_not_scale_again(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    spec: dict[str, Any] = {"replicas": {"min": 1, "max": 8}, "prometheus": {"url": prom.url}}
    with operator(kube_login):
        cluster.create(llmd(**spec))
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"), what="Deployment")
        wait_for(lambda: (cluster.status().get("controller") or {}).get("state") == "steady",
                 what="the controller ticking in steady state")
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
    calls = operator_calls(kube_login)

    # A new operator process, the alert still firing: it resumes the cooldown.
    with operator(kube_login):
        before = cluster.status()["controller"]["since"]
        wait_for(lambda: cluster.condition("Tuning")["message"] == "cooling down"
                 and cluster.status()["controller"]["since"] == before,
                 what="the restarted daemon to tick from the persisted state")
        seen = cluster.condition("Tuning")["lastTransitionTime"]
        wait_for(lambda: cluster.status()["controller"]["reason"] and
                 cluster.condition("Tuning")["lastTransitionTime"] == seen, what="ticks")
        assert cluster.owned("apps/v1", "deployments", "chat")["spec"]["replicas"] == 3
        assert scale_count(cluster) == 1
    missing = operator_calls(kube_login) | calls
    missing -= rbac_grants()
    assert not missing, f"the operator made calls rbac.yaml does not grant: {sorted(missing)}"


def test_retune_alert_puts_the_trial_on_the_canary_then_commits_to_all(
        kube_login: RunningEmulator, cluster: Cluster, prom: PrometheusStandIn,
        controller_env: None) -> None:
    pods = [PodStandIn(TOKEN), PodStandIn(TOKEN)]
    with serving(*pods), operator(kube_login):
        add_secret(cluster)
        cluster.create(llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                            tuning={"window": "1s", "canary": True}))
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"), what="Deployment")
        for i, pod in enumerate(pods):
            add_pod(cluster, "chat", i, pod)
        wait_for(lambda: (cluster.status().get("controller") or {}).get("state") == "steady",
                 what="steady")
        prom.fire("SlopilotTTFTP99High", "retune", "chat", NS)
        wait_for(lambda: cluster.events("Commit"), what="the commit", timeout=15)
        canary, other = pods[0].put_bodies(), pods[1].put_bodies()
        # The trial went to the canary alone; the commit to both, each with the token.
        assert [b["token_budget"] for b in canary] == [512, 512]
        assert [b["token_budget"] for b in other] == [512]
        assert {auth for p in pods for _, auth in p.puts} == {f"Bearer {TOKEN}"}
        cm = cluster.owned("v1", "configmaps", "chat-engine")
        assert json.loads(cm["data"]["engine.json"])["token_budget"] == 512
        status = cluster.status()
        assert status["tunedConfig"]["engine"]["chunk_size"] == 256
        assert status["config"]["tokenBudget"] == 512
        assert status["bestTrial"]["config"] == {"token_budget": 512, "chunk_size": 256}
        trial = cluster.events("Trial")[0].message
        assert "on canary" in trial and "retune: alert SlopilotTTFTP99High" in trial
        missing = operator_calls(kube_login) - rbac_grants()
        assert not missing, f"calls rbac.yaml does not grant: {sorted(missing)}"


def test_handle_sends_the_secret_token_and_a_wrong_one_fails_loudly(
        kube: RunningEmulator, cluster: Cluster) -> None:
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    pod = PodStandIn("the-right-token")
    with serving(pod):
        cluster.create(llmd(replicas={"min": 1, "max": 2}))
        add_pod(cluster, "chat", 0, pod)
        handle = KubeDeploymentHandle(cluster.kube, NS, "chat")
        with pytest.raises(ApplyError, match=r"Secret default/chat-admin .* is missing"):
            handle.apply_config({"token_budget": 512}, canary=True)
        add_secret(cluster, token="a-wrong-token")
        with pytest.raises(ApplyError, match="HTTP 401"):
            handle.apply_config({"token_budget": 512}, canary=True)
        assert pod.puts[-1][1] == "Bearer a-wrong-token"
        from slopilot.engine.config import ConfigError
        with pytest.raises(ConfigError, match="block_size cannot change on a running engine"):
            handle.apply_config({"block_size": 32}, canary=True)
        assert len(pod.puts) == 1  # the refused config never left the operator
