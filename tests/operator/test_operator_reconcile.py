"""The operator over real HTTP: objects follow the spec, drift is repaired, bad specs refused."""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None until they appear.
# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from slopilot.operator.drift import drift_condition
from slopilot.operator.engine_deployment import CHECKSUM_ANNOTATION
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Change, reconcile
from slopilot.operator.settings import operator_policy
from tests.operator.operator_support import (
    NS,
    Cluster,
    llmd,
    monitoring_crds,
    operator,
    operator_mint,
    operator_token,
    wait_for,
)
from tests.support.kube_server import RunningEmulator

ROOT = Path(__file__).parents[2]


def engine_json(cluster: Cluster, name: str = "chat") -> dict[str, object] | None:
    cm = cluster.owned("v1", "configmaps", f"{name}-engine")
    return None if cm is None else dict(json.loads(cm["data"]["engine.json"]))


def test_owned_objects_appear_follow_edits_and_come_back(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    with operator(kube_login):
        created = cluster.create(llmd(replicas={"min": 2, "max": 4},
                                      engine={"tokenBudget": 1024, "chunkSize": 512}))
        uid = created["metadata"]["uid"]
        dep = wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat"),
                       what="the Deployment")
        assert dep["spec"]["replicas"] == 2
        assert dep["metadata"]["ownerReferences"][0]["uid"] == uid
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["command"][:2] == ["slopilot", "serve"]
        svc = wait_for(lambda: cluster.owned("v1", "services", "chat"), what="the Service")
        assert svc["spec"]["ports"][0]["port"] == 8000
        assert engine_json(cluster)["token_budget"] == 1024
        rules = wait_for(lambda: cluster.owned("v1", "configmaps", "chat-rules"),
                         what="the plain rules ConfigMap (no prometheus-operator here)")
        assert "SlopilotTTFTP99High" in rules["data"]["slopilot-rules.yaml"]
        assert cluster.owned("monitoring.coreos.com/v1", "servicemonitors", "chat") is None

        status = wait_for(lambda: cluster.status().get("phase") == "Running"
                          and cluster.status(), what="status Running")
        assert status["replicas"] == 2 and status["config"]["tokenBudget"] == 1024
        assert cluster.condition("Valid")["status"] == "True"
        # The operator minted the engines' admin token and put only its digest in the pod
        # template: nothing in the tenant's namespace holds the token, no Secret is made.
        token = cluster.condition("AdminToken")
        assert token is not None and token["status"] == "True"
        assert "SLOPILOT_ADMIN_TOKEN_SHA256" in token["message"]
        assert "adminTokenSecret" not in status
        env = {e["name"]: e for e in c["env"]}
        assert env["SLOPILOT_ADMIN_TOKEN_SHA256"] == {
            "name": "SLOPILOT_ADMIN_TOKEN_SHA256",
            "value": hashlib.sha256(operator_token(cluster).encode()).hexdigest()}
        assert cluster.core.list_namespaced_secret(NS).items == []
        policy = wait_for(lambda: cluster.owned("networking.k8s.io/v1", "networkpolicies",
                                                "chat"), what="the NetworkPolicy")
        assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == ["http", "admin"]
        wait_for(lambda: cluster.events("Reconciled"), what="a Reconciled event")

        # Edit the spec: the ConfigMap and the Deployment follow.
        cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 2048},
                                        "replicas": {"min": 3}}})
        wait_for(lambda: (engine_json(cluster) or {}).get("token_budget") == 2048,
                 what="the ConfigMap to follow tokenBudget")
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "chat")["spec"][
            "replicas"] == 3, what="replicas raised to the new min")

        # Delete the Deployment: it comes back (a new object, same spec).
        old_uid = cluster.owned("apps/v1", "deployments", "chat")["metadata"]["uid"]
        cluster.apps.delete_namespaced_deployment("chat", NS)
        back = wait_for(lambda: (d := cluster.owned("apps/v1", "deployments", "chat"))
                        and d["metadata"]["uid"] != old_uid and d, what="the Deployment back")
        assert back["spec"]["replicas"] == 3
        wait_for(lambda: cluster.events("DriftRepaired"), what="a DriftRepaired event")

        # Edit an owned ConfigMap by hand: it is patched back.
        cluster.core.patch_namespaced_config_map("chat-engine", NS, {
            "data": {"engine.json": "{}"}})
        wait_for(lambda: (engine_json(cluster) or {}).get("token_budget") == 2048,
                 what="the hand edit to be undone")


OWNED_WATCHED = ("deployments", "networkpolicies", "services", "configmaps")


def test_the_operator_streams_only_the_objects_it_manages(kube_login: RunningEmulator,
                                                          cluster: Cluster) -> None:
    """kopf's ``labels=`` filter on a handler is applied in the operator: without a
    server-side selector every ConfigMap, Service, Deployment and NetworkPolicy of every
    tenant streams to it (read, deserialized, dropped). The watches carry the managed-by
    selector, so the API server sends the operator's own objects only; drift repair on
    them still works (the test above)."""
    with operator(kube_login):
        watches = wait_for(lambda: (w := [x for x in kube_login.emulator.watches
                                          if x[0] in OWNED_WATCHED])
                           and {p for p, _ in w} == set(OWNED_WATCHED) and w,
                           what="the operator's watches of the objects it owns")
    assert {selector for _, selector in watches} == {
        "app.kubernetes.io/managed-by=slopilot-operator"}


def test_invalid_spec_is_refused_with_condition_event_and_no_objects(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    with operator(kube_login):
        # The schema accepts it (each field alone is fine); the cross-class rule does not.
        cluster.create(llmd("bad", slo={"classes": {"p0": {"ttftP99Ms": 900}}}))
        valid = wait_for(lambda: cluster.condition("Valid", "bad"), what="the Valid condition")
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "spec.slo.classes.p0.ttftP99Ms=900 is looser than p1.ttftP99Ms=500" in valid[
            "message"]
        assert cluster.status("bad")["phase"] == "Invalid"
        event = wait_for(lambda: cluster.events("InvalidSpec"), what="the warning event")[0]
        assert event.type == "Warning" and "ttftP99Ms=900" in event.message
        assert cluster.owned("apps/v1", "deployments", "bad") is None
        assert cluster.owned("v1", "configmaps", "bad-engine") is None

        # Fixing the spec brings the objects and flips the condition.
        cluster.patch("bad", {"spec": {"slo": {"classes": {"p0": {"ttftP99Ms": 100}}}}})
        wait_for(lambda: cluster.owned("apps/v1", "deployments", "bad"), what="objects")
        wait_for(lambda: (cluster.condition("Valid", "bad") or {}).get("status") == "True",
                 what="Valid=True after the fix")


def test_vllm_knobs_it_lacks_are_named_and_monitoring_objects_used_when_served(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    kube_login.install(*monitoring_crds())
    with operator(kube_login):
        cluster.create(llmd("v", backend="vllm", engine={
            "tokenBudget": 2048, "preemption": {"mode": "swap", "swapTimeoutMs": 20}}))
        ignored = wait_for(lambda: cluster.condition("KnobsIgnored", "v"),
                           what="KnobsIgnored")
        assert ignored["status"] == "True"
        assert "preemption_mode" in ignored["message"] and "swap_timeout_ms" in ignored[
            "message"]
        dep = wait_for(lambda: cluster.owned("apps/v1", "deployments", "v"), what="Deployment")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--max-num-batched-tokens") + 1] == "2048"
        assert CHECKSUM_ANNOTATION in dep["spec"]["template"]["metadata"]["annotations"]
        sm = wait_for(lambda: cluster.owned("monitoring.coreos.com/v1", "servicemonitors", "v"),
                      what="the ServiceMonitor")
        relabel = {r["targetLabel"]: r["replacement"]
                   for r in sm["spec"]["endpoints"][0]["relabelings"]
                   if r["action"] == "replace" and "sourceLabels" not in r}
        assert relabel == {"slopilot_namespace": NS, "slopilot_deployment": "v"}
        rule = wait_for(lambda: cluster.owned("monitoring.coreos.com/v1", "prometheusrules",
                                              "slopilot-v"), what="the PrometheusRule")
        assert rule["metadata"]["ownerReferences"][0]["name"] == "v"
        assert cluster.owned("v1", "configmaps", "v-rules") is None
        assert cluster.condition("AdminToken", "v") is None  # vLLM has no admin endpoint


@pytest.mark.parametrize("spec", [
    {},
    # The API server stores each quantity in its canonical form (1 -> "1", 0.5 -> "500m",
    # 1.5Gi -> "1536Mi"): compared as written, each reconcile patched the Deployment.
    {"resources": {"gpu": 1, "cpu": "0.5", "memory": "1.5Gi"}},
    {"resources": {"gpu": 2, "cpu": 4, "memory": "1073741824"}, "backend": "vllm"},
], ids=["plain", "gpu-builtin", "gpu-vllm"])
def test_a_second_reconcile_writes_nothing(kube: RunningEmulator,
                                           kube_client: kubernetes.client.ApiClient,
                                           spec: dict[str, object]) -> None:
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    body = cluster.create(llmd(engine={"tokenBudget": 2048}, **spec))
    k = Kube(kube_client)
    args = {"policy": OperatorPolicy(), "mint": operator_mint(cluster)}
    first = reconcile(k, body, **args)
    assert set(first.changes.values()) == {Change.CREATED}
    versions = {n: o["metadata"]["resourceVersion"] for n, o in (
        ("dep", k.get("apps/v1", "deployments", NS, "chat")),
        ("cm", k.get("v1", "configmaps", NS, "chat-engine")))}
    writes = sum(1 for r in kube.emulator._requests if r.method.value != "GET")
    second = reconcile(k, body, **args)
    assert set(second.changes.values()) == {Change.UNCHANGED}
    assert sum(1 for r in kube.emulator._requests if r.method.value != "GET") == writes
    assert versions["dep"] == k.get("apps/v1", "deployments", NS, "chat")[
        "metadata"]["resourceVersion"]


@pytest.mark.parametrize("sample", ["llmdeployment-builtin.yaml", "llmdeployment-vllm.yaml"])
def test_a_shipped_samples_second_reconcile_writes_nothing(
        kube: RunningEmulator, cluster: Cluster, sample: str) -> None:
    """The samples ask for a GPU (``resources.gpu: 1``), stored as "1": rendered as the
    number, every event of the Deployment (its controller's status writes included) was a
    drift repair that patched it and wrote a DriftRepaired condition and event."""
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest())
    body = yaml.safe_load((ROOT / "manifests/samples" / sample).read_text())
    body["metadata"]["namespace"] = NS
    body = cluster.create(body)
    args = {"policy": OperatorPolicy(), "mint": operator_mint(cluster)}
    assert reconcile(cluster.kube, body, **args).valid
    second = reconcile(cluster.kube, body, **args)
    assert set(second.changes.values()) == {Change.UNCHANGED}
    assert drift_condition({"type": "Reconciled", "status": "True",
                            "reason": "OwnedObjectsInSync"}, second, 1) is None


def test_a_long_controller_tick_holds_up_no_reconcile(
        kube_login: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick may last minutes (a study queued for the simulator, then run for up to 600
    s; a slow Prometheus). It held the CR's lock throughout, so every spec update and
    drift event of that CR parked one of kopf's few handler threads (min(32, CPUs + 4))
    on it: a tenant with a few such CRs stalled every other tenant's reconciles."""
    from tests.operator.standins import StalledAlerts

    monkeypatch.setenv("SLOPILOT_CONTROLLER_FACTORY",
                       "tests.operator.standins:build_stalled_controller")
    monkeypatch.setenv("SLOPILOT_CONTROLLER_TICK_S", "0.2")
    StalledAlerts.entered.clear()
    StalledAlerts.release.clear()
    try:
        with operator(kube_login):
            cluster.create(llmd())
            wait_for(lambda: cluster.owned("v1", "services", "chat"), what="the Service")
            wait_for(StalledAlerts.entered.is_set, what="a tick stalled in the controller")
            cluster.core.delete_namespaced_service("chat", NS)
            wait_for(lambda: cluster.owned("v1", "services", "chat"),
                     what="the Service back while the tick lasts")
            cluster.patch("chat", {"spec": {"engine": {"tokenBudget": 2048}}})
            wait_for(lambda: (engine_json(cluster) or {}).get("token_budget") == 2048,
                     what="the spec edit reconciled while the tick lasts")
            assert not StalledAlerts.release.is_set()
            StalledAlerts.release.set()
    finally:
        StalledAlerts.release.set()


def test_the_lock_table_keeps_no_lock_of_a_deployment_no_one_holds() -> None:
    """One lock per namespace/name ever seen, kept for good, grew the operator's memory
    with every CR a tenant created and deleted under a new name."""
    import threading

    from slopilot.operator.cr_locks import LockTable

    locks = LockTable()
    for i in range(1000):
        with locks.hold(f"team-{i}/chat"):
            pass
    assert len(locks) == 0
    # Still one lock per deployment while anyone holds or waits for it.
    entered, order = threading.Event(), []
    with locks.hold("team-a/chat"):
        assert len(locks) == 1

        def second() -> None:
            entered.set()
            with locks.hold("team-a/chat"):
                order.append("second")

        waiter = threading.Thread(target=second)
        waiter.start()
        entered.wait()
        with locks.hold("team-b/chat"):  # another deployment's is another lock
            order.append("other")
        order.append("first")
    waiter.join()
    assert order == ["other", "first", "second"] and len(locks) == 0


def test_an_enforced_namespace_label_reaches_every_rule(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """With ``$SLOPILOT_NAMESPACE_LABEL`` (the Prometheus's enforcedNamespaceLabel) the
    PrometheusRule's series and alerts carry the CR's namespace there too, which the
    controller then matches (tests/tuner/test_alerts.py: a tenant's forged rule)."""
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest(), *monitoring_crds())
    cluster = Cluster(kube_client)
    body = cluster.create(llmd())
    policy = operator_policy({"SLOPILOT_NAMESPACE_LABEL": "namespace"})
    assert policy.namespace_label == "namespace"
    reconcile(Kube(kube_client), body, policy=policy, mint=operator_mint(cluster))
    rule = cluster.owned("monitoring.coreos.com/v1", "prometheusrules", "slopilot-chat")
    rules = rule["spec"]["groups"][0]["rules"]
    assert rules and all(r["labels"]["namespace"] == NS for r in rules)
    assert all(f'namespace="{NS}"' in r["expr"].replace("slopilot_namespace", "")
               for r in rules if "record" in r and "vllm:" in r["expr"])


def test_the_dcgm_exporters_namespace_reaches_the_rules(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    """With ``$SLOPILOT_DCGM_NAMESPACE`` the PrometheusRule reads the exporter's series
    scraped without honorLabels too, under that namespace only
    (tests/tuner/test_rules_dcgm.py: another tenant's series count for nothing)."""
    from slopilot.operator.crd import crd_manifest

    kube.install(crd_manifest(), *monitoring_crds())
    cluster = Cluster(kube_client)
    body = cluster.create(llmd())
    policy = operator_policy({"SLOPILOT_DCGM_NAMESPACE": "gpu-operator"})
    reconcile(Kube(kube_client), body, policy=policy, mint=operator_mint(cluster))
    rule = cluster.owned("monitoring.coreos.com/v1", "prometheusrules", "slopilot-chat")
    gpu = next(r["expr"] for r in rule["spec"]["groups"][0]["rules"]
               if r.get("record") == "slopilot:gpu_utilization:avg")
    assert f'namespace="gpu-operator",exported_namespace="{NS}"' in gpu
