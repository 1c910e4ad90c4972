"""Drift repair of the monitoring objects: the PrometheusRule and the ServiceMonitor.

They carry the deployment's alerts and the identity labels every rule selects on: a rule
deleted, or a ServiceMonitor's relabelings emptied, leaves the tuner with no alert to act
on. Their events repair them where prometheus-operator's CRDs exist; where they do not,
nothing about them is asked or written. The ``Reconciled`` condition says what a repair
put back, and when, or why it could not.
"""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None.
# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import copy
import logging
import re
from types import SimpleNamespace
from typing import Any

import kubernetes.client
import pytest

from slopilot.operator import handlers
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.crd import crd_manifest
from slopilot.operator.handlers import repair_drift, retry_drift_repair
from slopilot.operator.owned_meta import MANAGED
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Change, not_reconciled, reconcile
from slopilot.operator.spec import parse_spec
from slopilot.operator.spec_status import status_of, untuned_ready
from slopilot.operator.status_writer import write_status
from tests.operator.operator_support import (
    NS,
    Cluster,
    drift_handler,
    llmd,
    monitoring_crds,
    operator,
    operator_mint,
    wait_for,
)
from tests.support.kube_server import RunningEmulator

MON = "monitoring.coreos.com/v1"
GROUP = "monitoring.coreos.com"
RULE, MONITOR = "slopilot-chat", "chat"
WHEN = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def status_writes(kube: RunningEmulator) -> int:
    return sum(1 for r in list(kube.emulator._requests)
               if r.method.value == "PATCH" and r.subresource == "status"
               and r.resource is not None and r.resource.plural == "llmdeployments")


def writes(kube: RunningEmulator) -> int:
    return sum(1 for r in list(kube.emulator._requests) if r.method.value != "GET")


def monitoring_requests(kube: RunningEmulator) -> list[tuple[str, str]]:
    """Every request about a ServiceMonitor or PrometheusRule object (discovery aside)."""
    return [(r.method.value, r.resource.plural) for r in list(kube.emulator._requests)
            if r.resource is not None and r.resource.group == GROUP and r.resource.plural]


def repaired(cluster: Cluster) -> dict[str, Any] | None:
    """The Reconciled condition once a drift repair wrote it."""
    c = cluster.condition("Reconciled")
    return c if c is not None and c["reason"] == "DriftRepaired" else None


# --- the operator running --------------------------------------------------------------


def test_a_deleted_prometheus_rule_comes_back_and_the_condition_says_when(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    kube_login.install(*monitoring_crds())
    with operator(kube_login):
        cluster.create(llmd(tuning={"enabled": False}))
        first = wait_for(lambda: cluster.owned(MON, "prometheusrules", RULE),
                         what="the PrometheusRule")
        wait_for(lambda: (cluster.condition("Reconciled") or {}).get("status") == "True",
                 what="Reconciled")
        # The control: a deleted Service (watched all along) comes back.
        cluster.core.delete_namespaced_service("chat", NS)
        wait_for(lambda: cluster.owned("v1", "services", "chat"), what="the Service back")

        cluster.custom.delete_namespaced_custom_object(GROUP, "v1", NS, "prometheusrules",
                                                       RULE)
        back = wait_for(lambda: (r := cluster.owned(MON, "prometheusrules", RULE))
                        and r["metadata"]["uid"] != first["metadata"]["uid"] and r,
                        what="the PrometheusRule back")
        assert back["spec"] == first["spec"]
        assert back["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
        cond = wait_for(lambda: (c := repaired(cluster)) and RULE in c["message"] and c,
                        what="the condition naming the rule put back")
        assert cond["status"] == "True"
        assert re.fullmatch(f"repaired at {WHEN}: created PrometheusRule/{RULE}",
                            cond["message"]), cond


def test_a_service_monitor_stripped_of_its_relabelings_is_put_back(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    kube_login.install(*monitoring_crds())
    with operator(kube_login):
        cluster.create(llmd(tuning={"enabled": False}))
        sm = wait_for(lambda: cluster.owned(MON, "servicemonitors", MONITOR),
                      what="the ServiceMonitor")
        wanted = sm["spec"]["endpoints"][0]["relabelings"]
        assert wanted
        wait_for(lambda: (cluster.condition("Reconciled") or {}).get("status") == "True",
                 what="Reconciled")
        sm["spec"]["endpoints"][0]["relabelings"] = []  # every rule's selector matches nothing
        cluster.custom.replace_namespaced_custom_object(GROUP, "v1", NS, "servicemonitors",
                                                        MONITOR, sm)
        wait_for(lambda: cluster.owned(MON, "servicemonitors", MONITOR)["spec"]["endpoints"][
            0]["relabelings"] == wanted, what="the relabelings put back")
        cond = wait_for(lambda: (c := repaired(cluster)) and MONITOR in c["message"] and c,
                        what="the condition naming the ServiceMonitor")
        assert re.fullmatch(f"repaired at {WHEN}: patched ServiceMonitor/{MONITOR}",
                            cond["message"]), cond


def test_the_monitoring_watches_ask_for_managed_objects_only(
        kube_login: RunningEmulator) -> None:
    kube_login.install(*monitoring_crds())
    with operator(kube_login):
        watches = wait_for(lambda: (w := [x for x in kube_login.emulator.watches
                                          if x[0] in ("servicemonitors", "prometheusrules")])
                           and {p for p, _ in w} == {"servicemonitors", "prometheusrules"}
                           and w, what="the watches of the monitoring objects")
    assert {selector for _, selector in watches} == {
        "app.kubernetes.io/managed-by=slopilot-operator"}


def test_without_prometheus_operator_nothing_about_monitoring_is_asked_or_fails(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    with operator(kube_login) as runner:
        cluster.create(llmd(tuning={"enabled": False}))
        wait_for(lambda: cluster.owned("v1", "configmaps", "chat-rules"),
                 what="the rules as a ConfigMap")
        wait_for(lambda: (cluster.condition("Reconciled") or {}).get("status") == "True",
                 what="Reconciled")
        cluster.core.delete_namespaced_service("chat", NS)
        wait_for(lambda: cluster.owned("v1", "services", "chat"), what="the Service back")
        wait_for(lambda: repaired(cluster), what="the condition after the repair")
        assert monitoring_requests(kube_login) == []
        assert not [w for w in kube_login.emulator.watches
                    if w[0] in ("servicemonitors", "prometheusrules")]
    # operator() checked the clean exit; no handler failed on the way either. kopf warns
    # once that it cannot serve the two kinds (docs/operations.md says so).
    assert "Traceback" not in runner.output and "[ERROR" not in runner.output, runner.output
    assert "Unresolved resources cannot be served" in runner.output


# --- the handlers, called as kopf calls them --------------------------------------------


@pytest.fixture
def mon(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Cluster:
    """The emulator with the LLMDeployment and prometheus-operator CRDs."""
    kube.install(crd_manifest(), *monitoring_crds())
    return Cluster(kube_client)


def reconciled_chat(cluster: Cluster) -> tuple[dict[str, Any], SimpleNamespace]:
    """``chat`` created and reconciled with its monitoring objects; the handlers' memo."""
    body = cluster.create(llmd(tuning={"enabled": False}))
    memo = SimpleNamespace(kube=cluster.kube, locks=LockTable(), policy=OperatorPolicy(),
                           tokens=operator_mint(cluster))
    out = reconcile(cluster.kube, body, policy=memo.policy, mint=memo.tokens)
    assert out.changes[f"PrometheusRule/{RULE}"] is Change.CREATED
    # The status the spec handler writes with it (its ready count among it).
    ready = untuned_ready(cluster.kube, body)
    write_status(cluster.kube, NS, "chat", lambda fresh: status_of(fresh, out, ready))
    return body, memo


def event(cluster: Cluster, kind: str, plural: str, name: str, type_: str = "MODIFIED"
          ) -> dict[str, Any]:
    """The arguments kopf hands ``repair_drift`` for an event of an owned object."""
    obj = cluster.owned(MON, plural, name)
    assert obj is not None, f"{kind}/{name}"
    return {"event": {"type": type_, "object": obj}, "body": obj,
            "logger": logging.getLogger("test")}


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The events the handlers post (kopf's posting needs its running context)."""
    out: list[tuple[Any, ...]] = []
    monkeypatch.setattr(handlers, "post_events", lambda *a, **kw: out.append((a, kw)))
    return out


def test_an_event_of_an_object_in_sync_writes_nothing(
        kube: RunningEmulator, mon: Cluster, posted: list[Any]) -> None:
    _, memo = reconciled_chat(mon)
    mon.custom.patch_namespaced_custom_object(GROUP, "v1", NS, "servicemonitors", MONITOR,
                                              {"metadata": {"annotations": {"a": "b"}}})
    before = writes(kube)
    drift_handler(repair_drift, memo, **event(mon, "ServiceMonitor", "servicemonitors", MONITOR))
    assert writes(kube) == before
    assert posted == []


def test_a_repair_the_api_server_fails_says_so_and_is_tried_again(
        kube: RunningEmulator, mon: Cluster, posted: list[Any]) -> None:
    body, memo = reconciled_chat(mon)
    args = event(mon, "PrometheusRule", "prometheusrules", RULE, "DELETED")
    mon.custom.delete_namespaced_custom_object(GROUP, "v1", NS, "prometheusrules", RULE)
    kube.emulator.fail("POST", "prometheusrules", status=500, times=2)
    # A failed repair is no handler error: kopf drops those.
    drift_handler(repair_drift, memo, **args)
    cond = mon.condition("Reconciled")
    assert cond["status"] == "False" and cond["reason"] == "DriftNotRepaired", cond
    assert f"PrometheusRule/{RULE} not repaired: 500 InternalError" in cond["message"]
    assert "tries again every 60 s" in cond["message"]
    assert handlers.drift_unrepaired(status=mon.status())  # the retry timer runs now
    # Nor does it stop the controller: the objects are the CR's, one is missing a while.
    assert not_reconciled(mon.kube, mon.get(), parse_spec(mon.get())) is None
    # The same failure again: the condition says it already.
    count = status_writes(kube)
    drift_handler(retry_drift_repair, memo, body=mon.get(), logger=logging.getLogger("test"))
    assert status_writes(kube) == count
    # The API server takes it now: the timer's look repairs it and says so.
    drift_handler(retry_drift_repair, memo, body=mon.get(), logger=logging.getLogger("test"))
    assert mon.owned(MON, "prometheusrules", RULE) is not None
    cond = mon.condition("Reconciled")
    assert cond["status"] == "True" and cond["reason"] == "DriftRepaired", cond
    assert not handlers.drift_unrepaired(status=mon.status())
    assert [kw["reason"] for _, kw in posted] == ["DriftRepaired"]
    assert body["metadata"]["uid"] == mon.get()["metadata"]["uid"]


def test_an_object_of_the_name_that_is_not_the_crs_is_left_alone(
        kube: RunningEmulator, mon: Cluster, posted: list[Any]) -> None:
    body, memo = reconciled_chat(mon)
    ours = mon.owned(MON, "prometheusrules", RULE)
    args = event(mon, "PrometheusRule", "prometheusrules", RULE, "DELETED")
    mon.custom.delete_namespaced_custom_object(GROUP, "v1", NS, "prometheusrules", RULE)
    # Someone made their own of that name before the repair ran, labelled as the
    # operator's (so that its events reach it too), with no controller.
    theirs = copy.deepcopy(ours)
    theirs["metadata"] = {"name": RULE, "namespace": NS, "labels": dict(MANAGED)}
    theirs["spec"] = {"groups": []}
    mon.custom.create_namespaced_custom_object(GROUP, "v1", NS, "prometheusrules", theirs)
    before = mon.owned(MON, "prometheusrules", RULE)
    drift_handler(repair_drift, memo, **args)
    drift_handler(repair_drift, memo, **event(mon, "PrometheusRule", "prometheusrules", RULE))
    assert mon.owned(MON, "prometheusrules", RULE) == before
    cond = mon.condition("Reconciled")
    assert cond["status"] == "False" and cond["reason"] == "DriftNotRepaired", cond
    assert f"PrometheusRule/{RULE} already exists and is not managed by this " \
           "LLMDeployment (it has no controller)" in cond["message"]
    assert posted == []
    # Once they remove it, the timer's next look makes the CR's own again.
    mon.custom.delete_namespaced_custom_object(GROUP, "v1", NS, "prometheusrules", RULE)
    drift_handler(retry_drift_repair, memo, body=mon.get(), logger=logging.getLogger("test"))
    back = mon.owned(MON, "prometheusrules", RULE)
    assert back["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert mon.condition("Reconciled")["reason"] == "DriftRepaired"
