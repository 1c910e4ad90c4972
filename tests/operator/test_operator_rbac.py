"""The operator's whole life under exactly the RBAC that manifests/ grants it.

``slopilot operator`` runs as its own process with the ServiceAccount's token, and the
emulator's authorizer (kube_authz.py) holds that token to the rules the manifests bind
to the account, in each install shape docs/operations.md describes: the shipped one
(``--all-namespaces``, a ClusterRoleBinding) and the namespaced one (``--namespace``,
the ClusterRole bound by a RoleBinding in each served namespace, plus the cluster-scoped
kinds kopf lists). A refused call fails the test, named by verb, resource and namespace:
against a permissive API a missing verb would pass here and fail in a cluster. The
admission plugin OwnerReferencesPermissionEnforcement is on (hardened clusters run it),
so the owned objects' ``blockOwnerDeletion`` is checked as there.

The life: the start (token key, peering, the reclaim of the studies whose CRs went while
no operator ran: one in a database of the allow-list, one on the previous version's
record of study storages, which goes once emptied), a built-in deployment through a
trial on the canary and a commit to its pods, prometheus-operator's CRDs appearing, a
vLLM deployment with a ServiceMonitor and a PrometheusRule scaled by an alert, its
edited objects patched back (another controller's owner reference on one kept) and a
deleted Service put back, both CRs deleted (their studies with them), and a clean stop.
Then every grant that no call used is named: each that a shape leaves unused is listed
below with why it stays; any other fails the test (least privilege on a shared cluster).
"""

# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import kubernetes.client
import pytest
import yaml

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.reconcile import covers
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.settings import PEERING_LIFETIME_ENV
from slopilot.operator.study_ledger import LEDGER, entry_key
from slopilot.tuner.study.storage import open_study, study_names
from tests.operator.operator_support import (
    Cluster,
    add_pod,
    llmd,
    monitoring_crds,
    operator_token,
    wait_for,
)
from tests.operator.standins import PodStandIn, PrometheusStandIn, serving
from tests.support.kube_authz import Attributes, Rule, allowing, granted_to
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

MANIFESTS = Path(__file__).parents[2] / "manifests"
ACCOUNT = "slopilot-operator"
USER = f"system:serviceaccount:{DEFAULT_OPERATOR_NAMESPACE}:{ACCOUNT}"
TOKEN = "slopilot-operator-sa-token"
TEAM_A, TEAM_B = "team-a", "team-b"
RBAC_FILES = ("rbac.yaml", "namespaced-rbac.yaml")
NAMESPACED_ROLE = "slopilot-operator-namespaced"
# Drift on the vLLM deployment's objects (monitoring on): edits the operator reverts.
EDITS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("v1", "services", "vchat", {"spec": {"type": "NodePort"}}),
         ("networking.k8s.io/v1", "networkpolicies", "vchat",
          {"spec": {"policyTypes": ["Ingress", "Egress"]}}),
         ("policy/v1", "poddisruptionbudgets", "vchat", {"spec": {"maxUnavailable": 0}}),
         ("monitoring.coreos.com/v1", "servicemonitors", "vchat", {"spec": {"endpoints": []}}),
         ("monitoring.coreos.com/v1", "prometheusrules", "slopilot-vchat",
          {"spec": {"groups": []}}))

# Another controller's owner reference on an owned object (not the controller).
ARGO_REF = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "name": "team-b-apps",
            "uid": "6f1c1e5a-0000-4000-8000-00000000a860"}


def manifests() -> list[dict[str, Any]]:
    return [d for name in RBAC_FILES
            for d in yaml.safe_load_all((MANIFESTS / name).read_text(encoding="utf-8")) if d]


def subject() -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": DEFAULT_OPERATOR_NAMESPACE}


def cluster_wide() -> list[dict[str, Any]]:
    """The shipped install: as ``kubectl apply -k manifests/`` makes it."""
    return manifests()


def binding(kind: str, role: str, namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": role} | ({"namespace": namespace} if namespace else {})
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [subject()]}


def namespaced(served: tuple[str, ...]) -> list[dict[str, Any]]:
    """docs/operations.md's namespaced install: the ClusterRole bound by a RoleBinding in
    each served namespace instead of the ClusterRoleBinding, and the ClusterRole
    ``slopilot-operator-namespaced`` (namespaces and CRDs) by a ClusterRoleBinding."""
    docs = [d for d in manifests() if not (
        d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == ACCOUNT)]
    return [*docs, *(binding("RoleBinding", ACCOUNT, ns) for ns in served),
            binding("ClusterRoleBinding", NAMESPACED_ROLE)]


@dataclass(frozen=True)
class Shape:
    name: str
    args: tuple[str, ...]
    rbac: list[dict[str, Any]]
    # Grants of the roles bound in this shape that no call of its life uses, each with
    # why it stays: (role, apiGroup, resource, verb) -> why.
    idle: dict[tuple[str, str, str, str], str]


def _all(role: str, group: str, resource: str, verbs: str, why: str
         ) -> dict[tuple[str, str, str, str], str]:
    return {(role, group, resource, verb): why for verb in verbs.split()}


PEERING_VERBS = "get list watch patch create"
LEDGER_ROLE = "slopilot-operator-study-ledger"
# Each namespace here records one storage, once: its record is made, never written again.
LEDGER_PATCH = _all(LEDGER_ROLE, "", "configmaps", "patch",
                    "a namespace's record written again (a second storage, a rebuild): "
                    "test_study_reclaim.py, test_study_ledger_tenants.py")
PEERS_ROLE = "slopilot-operator-peers"
CLUSTER_WIDE = Shape(
    "cluster-wide", ("--all-namespaces",), cluster_wide(), {
        **_all(ACCOUNT, "kopf.dev", "kopfpeerings", PEERING_VERBS,
               "the namespaced shape's peering: one KopfPeering per served namespace"),
        **_all(PEERS_ROLE, "coordination.k8s.io", "leases", "list create patch delete",
               "the namespaced shape's peer registrations (its KopfPeerings are tenants' "
               "to write; the ClusterKopfPeering is not)"),
        **LEDGER_PATCH,
    })
NAMESPACED = Shape(
    "namespaced", ("--namespace", TEAM_A, "--namespace", TEAM_B),
    namespaced((TEAM_A, TEAM_B)), {
        **_all(ACCOUNT, "kopf.dev", "clusterkopfpeerings", PEERING_VERBS,
               "cluster-scoped: bound in a namespace it grants nothing (the "
               "cluster-wide shape's peering)"),
        **_all(ACCOUNT, "apiextensions.k8s.io", "customresourcedefinitions", "list watch",
               "cluster-scoped: bound in a namespace it grants nothing (the cluster-wide "
               "shape's; slopilot-operator-namespaced grants it here)"),
        **LEDGER_PATCH,
    })


@dataclass
class Operator:
    proc: subprocess.Popen[bytes]
    log: IO[str]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=HANG_GUARD_S)


@pytest.fixture
def running(kube: RunningEmulator, tmp_path: Path, studies: Path, request: pytest.FixtureRequest
            ) -> Iterator[tuple[Shape, Operator, dict[str, str]]]:
    """The operator's process, as the ServiceAccount of the shape's RBAC, started on the
    cluster ``prepare`` makes; and the orphaned studies there (storage: study)."""
    shape: Shape = request.param
    orphans = prepare(kube, studies)
    kube.emulator.restrict(TOKEN, USER, granted_to(shape.rbac, DEFAULT_OPERATOR_NAMESPACE,
                                                   ACCOUNT))
    kube.emulator.enforce_owner_references = True
    log = (tmp_path / "operator.log").open("w+")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_as(TOKEN, tmp_path / "sa.kubeconfig")),
           "PYTHONUNBUFFERED": "1",
           "SLOPILOT_CONTROLLER_FACTORY": "tests.operator.standins:build_controller",
           "SLOPILOT_CONTROLLER_TICK_S": "0.2",
           "SLOPILOT_OPERATOR_NAMESPACE": DEFAULT_OPERATOR_NAMESPACE,
           # The peer registration renewed (a third of it) well within the life: its
           # patch is used, not idle by chance.
           PEERING_LIFETIME_ENV: "6",
           # A directory for the CRs' own files, and one shared database the reclaim
           # visits for every served namespace.
           "SLOPILOT_ALLOWED_STORAGE": f"sqlite:///{studies}/*,sqlite:///{studies}/shared.db"}
    env.pop("POD_ID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slopilot.cli", "operator", *shape.args, "--peering=slopilot",
         "--priority=10"], env=env, stdout=log, stderr=subprocess.STDOUT)
    operator = Operator(proc, log)
    try:
        yield shape, operator, orphans
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=HANG_GUARD_S)
        print(f"--- operator ---\n{operator.output()}")  # shown when the test fails
        log.close()


def prepare(kube: RunningEmulator, studies: Path) -> dict[str, str]:
    """What the administrator installed before the operator's start, and the studies
    left by CRs of team-a deleted while no operator ran (the reclaim's to delete): one
    in the shared database, one in a file of the directory that the previous version
    put on its single record (the upgrade)."""
    ns = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
          for n in (DEFAULT_OPERATOR_NAMESPACE, TEAM_A, TEAM_B)]
    kube.install(crd_manifest(), *yaml.safe_load_all(
        (MANIFESTS / "kopf-peering.yaml").read_text(encoding="utf-8")), *ns)
    orphans = {f"sqlite:///{studies}/shared.db": f"{TEAM_A}/gone/{uuid.uuid4()}",
               f"sqlite:///{studies}/{TEAM_A}-old.db": f"{TEAM_A}/old/{uuid.uuid4()}"}
    for storage, study in orphans.items():
        open_study(storage, study)
    old = f"sqlite:///{studies}/{TEAM_A}-old.db"
    kube.install({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": LEDGER, "namespace": DEFAULT_OPERATOR_NAMESPACE}, "data": {
        entry_key(TEAM_A, old): json.dumps({"namespace": TEAM_A, "storage": old,
                                            "recorded": "2026-01-01T00:00:00Z"})}})
    return orphans


def calls_of(kube: RunningEmulator) -> list[Attributes]:
    """Every call the operator's account was allowed, the admission plugin's checks
    included."""
    return [call for user, call, allowed in list(kube.emulator.decisions)
            if user == USER and allowed]


def idle_grants(rules: list[Rule], rbac: list[dict[str, Any]], calls: list[Attributes]
                ) -> set[tuple[str, str, str, str]]:
    """(role, apiGroup, resource, verb) of every bound grant no call used."""
    origin: dict[Rule, str] = {}
    for role in rbac:
        if role["kind"] in ("ClusterRole", "Role"):
            for rule in granted_to([role, *[b for b in rbac if b["kind"].endswith(
                    "Binding") and b["roleRef"]["name"] == role["metadata"]["name"]]],
                    DEFAULT_OPERATOR_NAMESPACE, ACCOUNT):
                origin[rule] = role["metadata"]["name"]
    used = {(origin[rule], group, resource, verb)
            for call in calls for rule in allowing(rules, call)
            for group in rule.groups for resource in rule.resources for verb in rule.verbs
            if (group, resource, verb) == (call.group, call.resource, call.verb)}
    granted = {(origin[rule], group, resource, verb) for rule in rules
               for group in rule.groups for resource in rule.resources for verb in rule.verbs}
    return granted - used


def waiting(kube: RunningEmulator, condition: Callable[[], Any], what: str) -> Any:
    """``wait_for``, failing at once where the API server refused the operator a call
    (it would otherwise wait out the hang guard for what the refusal stopped)."""
    def check() -> Any:
        if refused := refusals(kube):
            raise AssertionError(f"the API server refused the operator: {refused}")
        return condition()

    return wait_for(check, what=what)


def reverted(cluster: Cluster, api: str, plural: str, name: str,
             edit: dict[str, Any]) -> bool:
    return not covers(cluster.owned(api, plural, name), edit)


def gone(kube: Kube, namespace: str, name: str) -> bool:
    return kube.get("slopilot.dev/v1alpha1", "llmdeployments", namespace, name) is None


def refusals(kube: RunningEmulator) -> list[str]:
    return sorted({f"{c.verb} {c.resource}" + (f".{c.group}" if c.group else "")
                   + (f" {c.name!r}" if c.name else "")
                   + (f" in namespace {c.namespace}" if c.namespace else " cluster-wide")
                   for user, c in kube.emulator.refused if user == USER})


@pytest.mark.parametrize("running", [CLUSTER_WIDE, NAMESPACED], indirect=True,
                         ids=lambda s: s.name)
def test_the_operator_lives_its_whole_life_on_exactly_the_shipped_rbac(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient, studies: Path,
        prom: PrometheusStandIn, running: tuple[Shape, Operator, str]) -> None:
    shape, operator, orphans = running
    admin = Kube(kube_client)
    team_a, team_b = Cluster(kube_client, TEAM_A), Cluster(kube_client, TEAM_B)

    # The start: the peering object, the token key, the reclaim (before any CR exists).
    waiting(kube, lambda: "orphaned studies reclaimed" in operator.output(), what="the reclaim")
    for storage, orphan in orphans.items():
        assert orphan not in study_names(storage), operator.output()
    assert admin.get("v1", "configmaps", DEFAULT_OPERATOR_NAMESPACE, LEDGER) is None

    # A built-in deployment: a trial on the canary, then the commit to both pods.
    pods = [PodStandIn(), PodStandIn()]
    with serving(*pods):
        body = llmd(replicas={"min": 2, "max": 4}, prometheus={"url": prom.url},
                    tuning={"window": "1s", "canary": True,
                            "storage": f"sqlite:///{studies}/{TEAM_A}.db"},
                    twin={"profile": {"configMapName": "smol-profile", "key": "p.yaml"}})
        body["metadata"]["namespace"] = TEAM_A
        team_a.create(body)
        waiting(kube, lambda: team_a.owned("apps/v1", "deployments", "chat"), what="Deployment")
        token = operator_token(team_a)
        for i, pod in enumerate(pods):
            pod.token = token
            add_pod(team_a, "chat", i, pod.port)
        waiting(kube, lambda: (team_a.status().get("controller") or {}).get("state")
                == "steady", what="the built-in deployment's controller in steady state")
        prom.fire("SlopilotTTFTP99High", "retune", "chat", TEAM_A)
        waiting(kube, lambda: team_a.events("Commit"), what="the commit")
        assert [b["token_budget"] for b in pods[1].put_bodies()] == [512]

    # prometheus-operator arrives; a vLLM deployment gets its monitor and rules, and an
    # alert scales it.
    kube.install(*monitoring_crds())
    body = llmd("vchat", backend="vllm", replicas={"min": 1, "max": 8},
                prometheus={"url": prom.url},
                tuning={"storage": f"sqlite:///{studies}/{TEAM_B}.db"})
    body["metadata"]["namespace"] = TEAM_B
    team_b.create(body)
    for plural in ("servicemonitors", "prometheusrules"):
        waiting(kube, functools.partial(admin.list, "monitoring.coreos.com/v1", plural,
                                        TEAM_B), what=f"the vLLM deployment's {plural}")
    waiting(kube, lambda: (team_b.status("vchat").get("controller") or {}).get("state")
            == "steady", what="the vLLM deployment's controller in steady state")
    prom.fire("SlopilotTBTP99High", "scale", "vchat", TEAM_B)
    waiting(kube, lambda: team_b.owned("apps/v1", "deployments", "vchat")["spec"]["replicas"]
            == 3, what="the scale 1 -> 3")

    # Drift: each edited object is patched back, a deleted Service is put back. Argo CD
    # adds its own owner reference to the Service first: kept, and no write of the list
    # (which needs delete on the Service under the admission plugin) is tried.
    refs = team_b.owned("v1", "services", "vchat")["metadata"]["ownerReferences"]
    team_b.kube.patch("v1", "services", TEAM_B, "vchat",
                      {"metadata": {"ownerReferences": [*refs, ARGO_REF]}})
    for api, plural, name, edit in EDITS:
        team_b.kube.patch(api, plural, TEAM_B, name, edit)
    for api, plural, name, edit in EDITS:
        waiting(kube, functools.partial(reverted, team_b, api, plural, name, edit),
                what=f"{plural}/{name} patched back")
    assert team_b.owned("v1", "services", "vchat")["metadata"]["ownerReferences"] == [
        *refs, ARGO_REF]
    uid = team_a.owned("v1", "services", "chat")["metadata"]["uid"]
    team_a.core.delete_namespaced_service("chat", TEAM_A)
    waiting(kube, lambda: (s := team_a.owned("v1", "services", "chat")) is not None
            and s["metadata"]["uid"] != uid, what="the Service put back")

    # Deletion: each daemon ends, its study goes, the finalizer is released.
    for cluster, name in ((team_a, "chat"), (team_b, "vchat")):
        cluster.custom.delete_namespaced_custom_object(
            "slopilot.dev", "v1alpha1", cluster.namespace, "llmdeployments", name)
    for cluster, name in ((team_a, "chat"), (team_b, "vchat")):
        waiting(kube, functools.partial(gone, admin, cluster.namespace, name),
                what=f"{name} gone")
    assert operator.stop() == 0

    refused = refusals(kube)
    assert not refused, f"the API server would refuse the operator ({shape.name}): {refused}"
    rules = granted_to(shape.rbac, DEFAULT_OPERATOR_NAMESPACE, ACCOUNT)
    idle = idle_grants(rules, shape.rbac, calls_of(kube))
    assert idle == set(shape.idle), (
        f"grants no call used ({shape.name}), not on the list of those that stay: "
        f"{sorted(idle - set(shape.idle))}; listed but used: "
        f"{sorted(set(shape.idle) - idle)}")
