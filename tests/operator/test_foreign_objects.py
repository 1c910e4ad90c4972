"""Objects the operator did not make are not its to change, whatever their names.

A tenant who may create LLMDeployments, but not NetworkPolicies or Deployments, names
one after an object that is already there: the namespace's deny-all policy, another
team's Deployment. The operator derives its objects' names from the CR's, so without a
check it would patch that object into its own (and make it garbage with the CR).
"""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None.
# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import API_VERSION, KIND, PLURAL, crd_manifest
from slopilot.operator.handlers import repair_drift
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.owned_meta import MANAGED
from slopilot.operator.pod_admin import ApplyError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import RETRY_NAME_TAKEN_S, Change, Refusal, reconcile
from slopilot.operator.spec_status import status_of
from tests.operator.operator_support import (
    NS,
    Cluster,
    daemon_loop,
    drift_handler,
    llmd,
    operator_mint,
)
from tests.support.kube_server import RunningEmulator

DENY_ALL = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny", "namespace": NS},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}


def web(name: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"}},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "nginx",
                                                           "image": "nginx"}]}}}}


@pytest.fixture
def cluster(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Cluster:
    kube.install(crd_manifest())
    return Cluster(kube_client)


def writes(kube: RunningEmulator) -> int:
    return sum(1 for r in kube.emulator._requests if r.method.value != "GET")


def test_an_object_of_the_same_name_that_is_not_ours_is_left_alone(
        kube: RunningEmulator, cluster: Cluster) -> None:
    k = cluster.kube
    k.create("networking.k8s.io/v1", "networkpolicies", NS, copy.deepcopy(DENY_ALL))
    before = k.get("networking.k8s.io/v1", "networkpolicies", NS, "default-deny")
    body = cluster.create(llmd("default-deny"))
    mint = operator_mint(cluster)
    count = writes(kube)
    out = reconcile(k, body, policy=OperatorPolicy(), mint=mint)
    # Refused before any write: not the Secret, not the ConfigMap before the policy.
    assert writes(kube) == count
    assert out.refusal is Refusal.NAME_TAKEN and not out.changes
    [problem] = out.problems
    assert "NetworkPolicy/default-deny already exists" in problem
    assert "not managed by this LLMDeployment" in problem and "no controller" in problem
    assert "use another name for the LLMDeployment, or remove that object" in problem
    after = k.get("networking.k8s.io/v1", "networkpolicies", NS, "default-deny")
    assert after == before  # the admin's deny-all still selects every pod, owned by no one
    assert k.get("apps/v1", "deployments", NS, "default-deny") is None
    # The status says so where a user looks: the spec is fine, its objects are not made.
    status = status_of(body, out)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Valid"]["status"] == "True"
    assert conditions["Reconciled"]["status"] == "False"
    assert conditions["Reconciled"]["reason"] == "NameTaken"


def test_another_teams_deployment_is_neither_adopted_nor_scaled(
        kube: RunningEmulator, cluster: Cluster) -> None:
    k = cluster.kube
    k.create("apps/v1", "deployments", NS, web("web"))
    body = cluster.create(llmd("web"))
    out = reconcile(k, body, policy=OperatorPolicy(), mint=operator_mint(cluster))
    assert out.refusal is Refusal.NAME_TAKEN
    assert any("Deployment/web already exists" in p for p in out.problems), out.problems
    dep = k.get("apps/v1", "deployments", NS, "web")
    assert not dep["metadata"].get("ownerReferences")
    assert [c["image"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["nginx"]
    assert k.get("v1", "services", NS, "web") is None  # nothing else was made either


def test_objects_an_earlier_llmdeployment_of_the_same_name_controls_are_not_taken(
        kube: RunningEmulator, cluster: Cluster) -> None:
    k = cluster.kube
    body = cluster.create(llmd())
    mint = operator_mint(cluster)
    assert reconcile(k, body, policy=OperatorPolicy(), mint=mint).valid
    # A CR of this name was deleted and made again before the garbage collector removed
    # the first one's objects: they name the same CR, with the earlier uid.
    earlier = "0f0f0f0f-earlier"
    dep = k.get("apps/v1", "deployments", NS, "chat")
    refs = [{**dep["metadata"]["ownerReferences"][0], "uid": earlier}]
    k.patch("apps/v1", "deployments", NS, "chat", {"metadata": {"ownerReferences": refs},
                                                   "spec": {"replicas": 4}})
    out = reconcile(k, body, policy=OperatorPolicy(), mint=mint)
    assert out.refusal is Refusal.NAME_TAKEN and out.retry_s is not None
    [problem] = out.problems
    assert f"an earlier LLMDeployment chat (uid {earlier})" in problem
    assert "garbage collector" in problem
    dep = k.get("apps/v1", "deployments", NS, "chat")
    assert dep["metadata"]["ownerReferences"][0]["uid"] == earlier
    assert dep["spec"]["replicas"] == 4  # not even its count was read as the CR's


def test_its_own_objects_are_still_patched_back(kube: RunningEmulator,
                                                cluster: Cluster) -> None:
    k = cluster.kube
    body = cluster.create(llmd())
    mint = operator_mint(cluster)
    assert set(reconcile(k, body, policy=OperatorPolicy(), mint=mint).changes.values()) \
        == {Change.CREATED}
    k.patch("v1", "services", NS, "chat",
            {"spec": {"selector": {"slopilot.dev/llmdeployment": "other"}}})
    out = reconcile(k, body, policy=OperatorPolicy(), mint=mint)
    assert out.valid and out.changes["Service/chat"] is Change.PATCHED


def test_the_handler_looks_again_while_the_name_is_taken(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # No event of an object the operator does not manage reaches it: once the admin
    # removes their policy, only kopf's retry makes the objects.
    import logging

    import kopf

    from slopilot.operator import handlers

    k = cluster.kube
    k.create("networking.k8s.io/v1", "networkpolicies", NS, copy.deepcopy(DENY_ALL))
    body = cluster.create(llmd("default-deny"))
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: None)
    memo = kopf.Memo(kube=k, locks=LockTable(), policy=OperatorPolicy(),
                     tokens=operator_mint(cluster))
    log = logging.getLogger("test")
    with pytest.raises(kopf.TemporaryError) as retry:
        handlers.reconcile_spec(body=body, memo=memo, logger=log)
    assert retry.value.delay == RETRY_NAME_TAKEN_S
    assert cluster.condition("Reconciled", "default-deny")["reason"] == "NameTaken"
    kubernetes.client.NetworkingV1Api(cluster.kube.client).delete_namespaced_network_policy(
        "default-deny", NS)
    handlers.reconcile_spec(body=cluster.get("default-deny"), memo=memo, logger=log)
    assert cluster.condition("Reconciled", "default-deny")["status"] == "True"
    policy = k.get("networking.k8s.io/v1", "networkpolicies", NS, "default-deny")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]


def test_no_controller_runs_for_a_deployment_that_is_not_the_crs(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    k = cluster.kube
    k.create("apps/v1", "deployments", NS, web("web"))
    body = cluster.create(llmd("web", prometheus={"url": "http://127.0.0.1:9"}))
    loop = daemon_loop(cluster, body, monkeypatch)
    assert loop.step() is True
    assert loop.controller is None
    tuning = cluster.condition("Tuning", "web")
    assert tuning["status"] == "False" and tuning["reason"] == "ControllerUnavailable"
    assert "Deployment/web already exists and is not managed by this LLMDeployment" \
        in tuning["message"]
    # The handle a controller would act through refuses the foreign Deployment too.
    with pytest.raises(ApplyError, match="not managed by this LLMDeployment"):
        loop.handle.scale(5)
    assert loop.handle.replicas() == 0  # none of this CR's
    assert k.get("apps/v1", "deployments", NS, "web")["spec"]["replicas"] == 3


@pytest.mark.parametrize("name", ["web.v2", "9lives"])
def test_no_controller_runs_for_a_cr_whose_objects_cannot_be_made(
        kube: RunningEmulator, cluster: Cluster, name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A dotted name is a valid CR and Deployment name, and no valid Service name: the
    # reconcile refuses it (OwnedObjectInvalid), and the daemon must not then scale a
    # Deployment of that name someone else made.
    k = cluster.kube
    k.create("apps/v1", "deployments", NS, web(name)) if "." in name else None
    body = cluster.create(llmd(name, prometheus={"url": "http://127.0.0.1:9"}))
    loop = daemon_loop(cluster, body, monkeypatch)
    assert loop.step() is True and loop.controller is None
    tuning = cluster.condition("Tuning", name)
    assert tuning["reason"] == "ControllerUnavailable"
    assert "the reconcile refuses this LLMDeployment's objects" in tuning["message"]


def test_a_controller_runs_once_the_objects_are_the_crs(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    body = cluster.create(llmd(prometheus={"url": "http://127.0.0.1:9"},
                               replicas={"min": 1, "max": 4}))
    assert reconcile(cluster.kube, body, policy=OperatorPolicy(),
                     mint=operator_mint(cluster)).valid
    loop = daemon_loop(cluster, cluster.get(), monkeypatch)
    assert loop.step() is True and loop.controller is not None
    loop.handle.scale(2)
    assert cluster.kube.get("apps/v1", "deployments", NS, "chat")["spec"]["replicas"] == 2


def test_an_owner_reference_cannot_steer_the_operator_into_another_namespace(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server checks an owner reference's kind and uid, not its name, and the
    drift handler GETs the owner by that name: a tenant's ConfigMap (labelled as the
    operator's, so it is watched) named its owner ``../../team-b/llmdeployments/chat``,
    and the client's path normalization turned the GET into one of team-b's object,
    which the operator then reconciled as this namespace's owner."""
    k = cluster.kube
    theirs = k.create(API_VERSION, PLURAL, "team-b", {
        **llmd(), "metadata": {"name": "chat", "namespace": "team-b"}})
    bait = k.create("v1", "configmaps", NS, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bait", "namespace": NS, "labels": dict(MANAGED),
                     "ownerReferences": [{
                         "apiVersion": API_VERSION, "kind": KIND,
                         "name": "../../team-b/llmdeployments/chat",
                         "uid": theirs["metadata"]["uid"], "controller": True,
                         "blockOwnerDeletion": True}]}})
    memo = SimpleNamespace(kube=k, locks=LockTable(), policy=OperatorPolicy(),
                           tokens=operator_mint(cluster))
    posted: list[Any] = []
    monkeypatch.setattr(kopf, "info", lambda body, **kw: posted.append((body, kw)))
    monkeypatch.setattr(kopf, "warn", lambda body, **kw: posted.append((body, kw)))
    seen = len(kube.emulator._requests)
    drift_handler(repair_drift, memo, event={"type": "MODIFIED"}, body=bait,
                  logger=logging.getLogger(__name__))
    assert [(r.method.value, r.namespace, r.name) for r in kube.emulator._requests[seen:]
            if r.namespace not in (NS, None)] == []
    assert posted == []
    # And no other road: a name that is not one path segment never becomes a request.
    for name in ("..", "../../team-b/llmdeployments/chat", "chat%2F..", "a/b"):
        with pytest.raises(ValueError, match="is no object name"):
            k.get(API_VERSION, PLURAL, NS, name)


def _before_first_patch(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, plural: str,
                        meanwhile: Callable[[], None]) -> None:
    """Run ``meanwhile`` just before the first patch of a ``plural`` is sent through
    ``cluster.kube``: what another writer did between the operator's look at the object
    and its write."""
    k = cluster.kube
    patch, pending = k.patch, [meanwhile]

    def patch_after(api_version: str, of: str, *args: Any, **kwargs: Any) -> Any:
        if of == plural and pending:
            pending.pop()()
        return patch(api_version, of, *args, **kwargs)

    monkeypatch.setattr(k, "patch", patch_after)


def _scaling_handle(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                    meanwhile: Callable[[], None]) -> KubeDeploymentHandle:
    """A reconciled ``chat`` (1..4 replicas) and its handle, whose first patch of a
    Deployment runs ``meanwhile`` just before it is sent."""
    body = cluster.create(llmd(replicas={"min": 1, "max": 4}))
    mint = operator_mint(cluster)
    assert reconcile(cluster.kube, body, policy=OperatorPolicy(), mint=mint).valid
    _before_first_patch(cluster, monkeypatch, "deployments", meanwhile)
    return KubeDeploymentHandle(cluster.kube, NS, "chat", mint=mint, policy=OperatorPolicy(),
                                uid=body["metadata"]["uid"])


def test_a_scale_never_lands_on_a_deployment_made_again_under_its_name(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scale looked at the Deployment (the CR's, by uid), then patched its replicas
    by name: one deleted and made again meanwhile under that name (another team's) was
    scaled instead."""
    def replaced() -> None:
        cluster.apps.delete_namespaced_deployment("chat", NS)
        cluster.kube.create("apps/v1", "deployments", NS, web("chat"))

    handle = _scaling_handle(cluster, monkeypatch, replaced)
    with pytest.raises(ApplyError, match=r"chat: not scaled: Deployment/chat .*not managed "
                       "by this LLMDeployment"):
        handle.scale(2)
    theirs = cluster.kube.get("apps/v1", "deployments", NS, "chat")
    assert not theirs["metadata"].get("ownerReferences")
    assert theirs["spec"]["replicas"] == 3  # its own count, not the scale's


def test_a_scale_never_lands_on_a_deployment_orphaned_meanwhile(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same object (its uid unchanged) can stop being the CR's: the garbage collector
    strips the owner reference when its owner is deleted with propagationPolicy Orphan.
    The scale judged it by the version it read, and that version is what it patches."""
    def orphaned() -> None:
        cluster.kube.patch("apps/v1", "deployments", NS, "chat",
                           {"metadata": {"ownerReferences": None}})

    handle = _scaling_handle(cluster, monkeypatch, orphaned)
    with pytest.raises(ApplyError, match=r"Deployment/chat .*not managed by this "
                       "LLMDeployment"):
        handle.scale(2)
    assert cluster.kube.get("apps/v1", "deployments", NS, "chat")["spec"]["replicas"] == 1


def test_a_scale_still_lands_when_only_the_deployments_status_moved_meanwhile(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Deployment controller writes status all the time (a new resourceVersion each):
    a scale whose precondition met one reads the Deployment again and goes on."""
    def status_written() -> None:
        cluster.kube.patch("apps/v1", "deployments", NS, "chat",
                           {"status": {"observedGeneration": 1, "replicas": 1}},
                           subresource="status")

    handle = _scaling_handle(cluster, monkeypatch, status_written)
    handle.scale(2)
    assert cluster.kube.get("apps/v1", "deployments", NS, "chat")["spec"]["replicas"] == 2


def test_a_reconcile_never_patches_an_object_made_again_under_its_name(
        kube: RunningEmulator, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile judged each owned name (the CR's, by uid), then patched what differed
    by name: a Service deleted and made again meanwhile by another owner was patched into
    the CR's, owner reference and all (rewritten, and garbage-collected with the CR)."""
    k = cluster.kube
    body = cluster.create(llmd())
    mint = operator_mint(cluster)
    assert reconcile(k, body, policy=OperatorPolicy(), mint=mint).valid
    # Drifted: the next reconcile patches it back.
    k.patch("v1", "services", NS, "chat",
            {"spec": {"selector": {"slopilot.dev/llmdeployment": "other"}}})
    theirs = {"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "chat", "namespace": NS, "labels": {"app": "web"}},
              "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}

    def replaced() -> None:
        cluster.core.delete_namespaced_service("chat", NS)
        k.create("v1", "services", NS, copy.deepcopy(theirs))

    _before_first_patch(cluster, monkeypatch, "services", replaced)
    out = reconcile(k, body, policy=OperatorPolicy(), mint=mint)
    assert out.refusal is Refusal.NAME_TAKEN, out
    assert any("Service/chat already exists" in p for p in out.problems), out.problems
    service = k.get("v1", "services", NS, "chat")
    assert not service["metadata"].get("ownerReferences")
    assert service["spec"]["selector"] == {"app": "web"}


# --- a tenant's own PodDisruptionBudget of the CR's name --------------------------------

def _their_budget() -> dict[str, Any]:
    """A tenant's budget of its pods, made before the operator rendered one of its own."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "chat", "namespace": NS},
            "spec": {"minAvailable": 1,
                     "selector": {"matchLabels": {"app.kubernetes.io/instance": "chat"}}}}


def test_a_tenants_own_budget_of_the_name_is_left_alone_and_said_not_refused(
        kube: RunningEmulator, cluster: Cluster) -> None:
    k = cluster.kube
    k.create("policy/v1", "poddisruptionbudgets", NS, _their_budget())
    before = k.get("policy/v1", "poddisruptionbudgets", NS, "chat")
    body = cluster.create(llmd())
    out = reconcile(k, body, policy=OperatorPolicy(), mint=operator_mint(cluster))
    assert out.valid, out.problems
    assert out.changes["Deployment/chat"] is Change.CREATED
    assert "PodDisruptionBudget/chat" not in out.changes
    assert k.get("policy/v1", "poddisruptionbudgets", NS, "chat") == before
    [said] = out.left_alone
    assert "PodDisruptionBudget/chat" in said and "delete this one" in said
    conditions = {c["type"]: c for c in status_of(body, out)["conditions"]}
    assert conditions["Valid"]["status"] == "True"
    assert conditions["Reconciled"]["status"] == "True"
    assert conditions["DisruptionBudget"]["status"] == "False"
    assert conditions["DisruptionBudget"]["reason"] == "ForeignBudget"
    assert conditions["DisruptionBudget"]["message"] == said
    # Once the tenant deletes theirs, the operator makes its own, and says nothing more.
    k.delete("policy/v1", "poddisruptionbudgets", NS, "chat")
    again = reconcile(k, body, policy=OperatorPolicy(), mint=operator_mint(cluster))
    assert again.changes["PodDisruptionBudget/chat"] is Change.CREATED
    assert not again.left_alone
    fresh = {**body, "status": status_of(body, out)}
    assert "DisruptionBudget" not in {c["type"] for c in status_of(fresh, again)["conditions"]}


def test_a_tenants_budget_made_before_the_upgrade_blocks_no_trial(
        kube: RunningEmulator, cluster: Cluster) -> None:
    k = cluster.kube
    body = cluster.create(llmd(backend="vllm"))
    mint, policy = operator_mint(cluster), OperatorPolicy()
    assert reconcile(k, body, policy=policy, mint=mint).valid
    # As before this version rendered budgets: none of the operator's, the tenant's own.
    k.delete("policy/v1", "poddisruptionbudgets", NS, "chat")
    k.create("policy/v1", "poddisruptionbudgets", NS, _their_budget())
    handle = KubeDeploymentHandle(k, NS, "chat", mint=mint, policy=policy)
    handle.apply_config({"token_budget": 512, "chunk_size": 256}, canary=False, trial=True)
    args = k.get("apps/v1", "deployments", NS, "chat")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert args[args.index("--max-num-batched-tokens") + 1] == "512"
    assert k.get("policy/v1", "poddisruptionbudgets", NS, "chat")["spec"]["minAvailable"] == 1
