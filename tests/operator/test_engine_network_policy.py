"""Each engine's NetworkPolicy admits its own namespace, the cluster's Prometheus and the
administrator's peers to ``http``, and no one else; the operator puts it back exactly.

A rule with no ``from`` admits every pod of every namespace, and NetworkPolicies only
add: no default-deny of the tenant's could close the engine's inference port to other
teams, and the operator's drift repair put the open rule back over any narrowing.
"""

# CustomObjectsApi (client 37) returns ``object``.
# mypy: disable-error-code="index,arg-type"

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.operator.crd import crd_manifest
from slopilot.operator.network_peers import (
    DEFAULT_PROMETHEUS_PEERS,
    INGRESS_PEERS_ENV,
    PROMETHEUS_PEERS_ENV,
    Peer,
    PeerError,
    parse_peers,
)
from slopilot.operator.policy import OperatorPolicy, PolicyError
from slopilot.operator.reconcile import Change, reconcile
from slopilot.operator.settings import operator_policy
from tests.operator.operator_support import NS, Cluster, llmd, operator_mint
from tests.support.kube_server import RunningEmulator

ROOT = Path(__file__).parents[2]
NP = ("networking.k8s.io/v1", "networkpolicies")
PROMETHEUS = ({"kubernetes.io/metadata.name": "monitoring"},
              {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"})


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "only matchLabels is read here"
    return selector.get("matchLabels", {}).items() <= labels.items()


def admits(policy: dict[str, Any], namespace: dict[str, str], pod: dict[str, str],
           port: str) -> bool:
    """Whether ``policy`` (in namespace ``NS``) lets a pod (its namespace's labels, its
    own) reach ``port``, by the NetworkPolicy API's rules: a rule without ``from`` admits
    all; peers OR-ed, a peer's selectors AND-ed, a missing namespaceSelector the
    policy's own namespace."""
    for rule in policy["spec"]["ingress"]:
        if not any(p["port"] == port for p in rule["ports"]):
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            assert "ipBlock" not in peer
            in_namespace = (matches(peer["namespaceSelector"], namespace)
                            if "namespaceSelector" in peer
                            else namespace.get("kubernetes.io/metadata.name") == NS)
            if in_namespace and matches(peer.get("podSelector", {}), pod):
                return True
    return False


def ns(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}


def reconciled(cluster: Cluster, kube: RunningEmulator, policy: OperatorPolicy,
               **spec: Any) -> dict[str, Any]:
    kube.install(crd_manifest())
    body = cluster.create(llmd(**spec))
    assert reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster)).valid
    return dict(cluster.owned(*NP, "chat"))


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_http_admits_the_namespace_prometheus_and_the_admins_peers_only(
        kube: RunningEmulator, cluster: Cluster, backend: str) -> None:
    gateway = Peer("gateway", setting=INGRESS_PEERS_ENV)
    policy = reconciled(cluster, kube, OperatorPolicy(engine_ingress_peers=(gateway,)),
                        backend=backend)
    assert admits(policy, ns(NS), {"app": "client"}, "http")
    assert admits(policy, *PROMETHEUS, "http")
    assert admits(policy, ns("gateway"), {"app": "envoy"}, "http")
    for namespace, pod in [
            (ns("team-b"), {"app": "chat"}),
            # Labelled as Prometheus, outside Prometheus' namespace.
            (ns("team-b"), {"app.kubernetes.io/name": "prometheus"}),
            # Any other pod of Prometheus' namespace.
            (PROMETHEUS[0], {"app.kubernetes.io/name": "grafana"}),
            (ns("slopilot-system"), {"app.kubernetes.io/name": "slopilot-operator"})]:
        assert not admits(policy, namespace, pod, "http"), (namespace, pod)
    # The admin port (builtin alone has one): the operator's pods only.
    assert admits(policy, ns("slopilot-system"), {"app.kubernetes.io/name":
                                                  "slopilot-operator"},
                  "admin") is (backend == "builtin")
    assert not admits(policy, ns(NS), {"app": "client"}, "admin")


def test_a_removed_or_widened_from_is_put_back(kube: RunningEmulator,
                                               cluster: Cluster) -> None:
    policy = OperatorPolicy()
    rendered = reconciled(cluster, kube, policy)
    http_rule = rendered["spec"]["ingress"][0]
    assert http_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    mint = operator_mint(cluster)
    for widened in (
            {k: v for k, v in http_rule.items() if k != "from"},  # from removed
            {**http_rule, "from": []},  # emptied
            # The namespace's own peer made every namespace's (a superset of each field).
            {**http_rule, "from": [{**http_rule["from"][0], "namespaceSelector": {}},
                                   *http_rule["from"][1:]]},
            # A peer added.
            {**http_rule, "from": [*http_rule["from"], {"namespaceSelector": {}}]}):
        cluster.kube.patch(*NP, NS, "chat", {"spec": {"ingress": [
            widened, *rendered["spec"]["ingress"][1:]]}})
        outcome = reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
        assert outcome.changes["NetworkPolicy/chat"] is Change.PATCHED, widened
        assert cluster.owned(*NP, "chat")["spec"] == rendered["spec"]
    # The policy made to select fewer pods leaves the rest open: put back too.
    cluster.kube.patch(*NP, NS, "chat", {"spec": {"podSelector": {"matchLabels": {
        **rendered["spec"]["podSelector"]["matchLabels"], "pinned": "yes"}}}})
    outcome = reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
    assert outcome.changes["NetworkPolicy/chat"] is Change.PATCHED
    assert cluster.owned(*NP, "chat")["spec"] == rendered["spec"]
    # Egress added: the engine cut off from the cluster (vLLM from its model store).
    cluster.kube.patch(*NP, NS, "chat", {"spec": {"policyTypes": ["Ingress", "Egress"],
                                                  "egress": [{"to": [{"podSelector": {}}]}]}})
    outcome = reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
    assert outcome.changes["NetworkPolicy/chat"] is Change.PATCHED
    assert cluster.owned(*NP, "chat")["spec"] == rendered["spec"]
    # Put back, nothing more is sent.
    outcome = reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
    assert outcome.changes["NetworkPolicy/chat"] is Change.UNCHANGED
    # And a backend switch renders the same http rule.
    cluster.patch("chat", {"spec": {"backend": "vllm"}})
    reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
    assert cluster.owned(*NP, "chat")["spec"]["ingress"] == [http_rule]


def test_peers_are_read_from_the_environment() -> None:
    policy = operator_policy({
        PROMETHEUS_PEERS_ENV: "monitoring:app.kubernetes.io/name=prometheus+prometheus=k8s,"
                              " obs:app=prom",
        INGRESS_PEERS_ENV: "gateway, mesh:app=ingress"})
    assert [p.to_api() for p in policy.prometheus_peers] == [
        {"namespaceSelector": {"matchLabels": ns("monitoring")},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus",
                                         "prometheus": "k8s"}}},
        {"namespaceSelector": {"matchLabels": ns("obs")},
         "podSelector": {"matchLabels": {"app": "prom"}}}]
    assert [p.entry() for p in policy.engine_ingress_peers] == ["gateway", "mesh:app=ingress"]
    unset = operator_policy({})
    assert unset.prometheus_peers == DEFAULT_PROMETHEUS_PEERS
    assert unset.engine_ingress_peers == ()


@pytest.mark.parametrize(("raw", "said"), [
    ("Monitoring", "'Monitoring' is not a namespace name"),
    ("*", "'*' is not a namespace name"),
    ("monitoring:", "no label after ':'"),
    ("monitoring:app", "'app' is not key=value"),
    ("monitoring:=x", "'=x' is not key=value"),
    ("monitoring:a=b+a=c", "a label key named twice"),
    ("monitoring:bad key=x", "'bad key' is not a label key"),
    ("monitoring:app=-x", "'-x' is not a label value"),
])
@pytest.mark.parametrize("setting", [PROMETHEUS_PEERS_ENV, INGRESS_PEERS_ENV])
def test_a_bad_peer_stops_the_start_naming_the_variable_entry_and_fix(
        setting: str, raw: str, said: str) -> None:
    with pytest.raises(PolicyError) as caught:
        operator_policy({setting: raw})
    message = str(caught.value)
    assert message.startswith(f"{setting} entry {raw!r}"), message
    assert said in message, message
    with pytest.raises(PeerError):
        parse_peers(raw, setting)


def test_an_empty_prometheus_peer_list_is_refused() -> None:
    """Blank, no Prometheus could scrape an engine: the loop would read no goodput."""
    with pytest.raises(PolicyError, match=f"{PROMETHEUS_PEERS_ENV} is empty"):
        operator_policy({PROMETHEUS_PEERS_ENV: " , "})
    with pytest.raises(PolicyError, match=f"{PROMETHEUS_PEERS_ENV} is empty"):
        OperatorPolicy(prometheus_peers=())


def test_the_shipped_prometheus_peer_is_the_operator_policys_own() -> None:
    """One Prometheus: the peer operator.yaml gives the engines is the one the operator's
    own NetworkPolicy admits to its ``metrics``, and the default."""
    (deployment,) = [d for d in yaml.safe_load_all(
        (ROOT / "manifests" / "operator.yaml").read_text()) if d]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    shipped = parse_peers(env[PROMETHEUS_PEERS_ENV], PROMETHEUS_PEERS_ENV)
    (own,) = [d for d in yaml.safe_load_all(
        (ROOT / "manifests" / "operator-network-policy.yaml").read_text()) if d]
    (rule,) = own["spec"]["ingress"]
    assert [p.to_api() for p in shipped] == rule["from"]
    assert shipped == DEFAULT_PROMETHEUS_PEERS


def _as_stored(value: Any) -> Any:
    """As a real API server hands a NetworkPolicy back: a LabelSelector's empty
    ``matchLabels`` and ``matchExpressions`` are ``omitempty``, dropped as it stores."""
    if isinstance(value, dict):
        return {k: _as_stored(v) for k, v in value.items()
                if not (k in ("matchLabels", "matchExpressions") and not v)}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    return value


def test_a_namespace_only_peer_reads_in_sync_as_the_api_server_stores_it(
        kube: RunningEmulator, cluster: Cluster) -> None:
    """A peer naming a namespace alone (the gateway's, ``monitoring`` for Prometheus):
    a selector rendered ``{"matchLabels": {}}`` came back ``{}`` from a real API server,
    and the policy, compared whole, was patched at every reconcile, each one said as a
    repair. The emulator keeps bodies as given, so the server's storing is played."""
    policy = OperatorPolicy(prometheus_peers=(Peer("monitoring", setting=PROMETHEUS_PEERS_ENV),),
                            engine_ingress_peers=(Peer("gateway", setting=INGRESS_PEERS_ENV),))
    rendered = reconciled(cluster, kube, policy)
    mint = operator_mint(cluster)
    for _ in range(2):
        cluster.kube.request("PUT", f"/apis/{NP[0]}/namespaces/{NS}/{NP[1]}/chat",
                             body=_as_stored(cluster.owned(*NP, "chat")))
        outcome = reconcile(cluster.kube, cluster.get(), policy=policy, mint=mint)
        assert outcome.changes["NetworkPolicy/chat"] is Change.UNCHANGED
    assert admits(cluster.owned(*NP, "chat"), ns("gateway"), {"app": "envoy"}, "http")
    assert rendered["spec"] == _as_stored(rendered["spec"])
