"""The scrape limits on the operator's ServiceMonitor, checked against what a replica
really exports.

The ServiceMonitor selects Services by the deployment's labels in the CR's namespace, and
any pod of that namespace carrying those labels (a tenant's bare pod, any image) is an
endpoint of the operator's Service: without limits its /metrics went into the shared
Prometheus unbounded. The limits are sized from the expositions measured here, so that
one series added to the engine that takes it past ``scrape_limits``' figures fails this
test rather than, in a cluster, every scrape of the deployment (Prometheus fails the
whole scrape of a target over its ``sampleLimit``: ``up`` 0).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.clients import MAX_KEYS, ClientClasses
from slopilot.engine.server.client_counts import ClientCounts
from slopilot.engine.slo import SLOSpec
from slopilot.operator import scrape_limits
from slopilot.operator.crd import crd_manifest
from slopilot.operator.drift import drift_condition
from slopilot.operator.owned_fields import removals
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import MONITORING, Change, Outcome, reconcile
from slopilot.operator.render import render_all
from slopilot.operator.service_monitor import render_service_monitor
from slopilot.operator.spec import parse_spec
from slopilot.operator.validation import MAX_MODEL_REF
from tests.operator.operator_support import (
    NS,
    Cluster,
    llmd,
    monitoring_crds,
    operator_mint,
)
from tests.support.kube_server import RunningEmulator
from tests.support.live_server import start_server
from tests.support.waits import HANG_GUARD_S

LIMIT_FIELDS = ("sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit",
                "labelValueLengthLimit", "bodySizeLimit")
# prometheus-operator's ByteSize (pkg/apis/monitoring/v1/types.go), powers of 2.
BYTE_SIZE = re.compile(r"(^0|([0-9]*[.])?[0-9]+((K|M|G|T|E|P)i?)?B)$")
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}
# The labels a scrape adds to each series on top of what the target exports: the
# Prometheus Operator's target labels (job, namespace, service, pod, container,
# endpoint, instance), the ServiceMonitor's identity labels (slopilot_namespace,
# slopilot_deployment), a vLLM series' priority_class, and __name__, which
# Prometheus's label limit counts too.
SCRAPE_LABELS = 11


def body(backend: str = "builtin", **spec: Any) -> dict[str, Any]:
    b = llmd(**spec)
    b["metadata"].update(namespace="team-a", uid="u1")
    b["spec"]["backend"] = backend
    return b


def monitor(b: dict[str, Any]) -> dict[str, Any]:
    sm: dict[str, Any] = render_service_monitor(b, parse_spec(b))
    return sm


def byte_size(text: str) -> int:
    assert BYTE_SIZE.fullmatch(text), text
    number, unit = re.fullmatch(r"([0-9.]+)([KMGTEP]?i?B)", text).groups()  # type: ignore[union-attr]
    return int(float(number) * UNITS[unit])


def exposition_stats(text: str) -> dict[str, int]:
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return {"samples": len(samples), "bytes": len(text.encode()),
            "labels": max(len(s.labels) for s in samples),
            "name_length": max(len(k) for s in samples for k in s.labels),
            "value_length": max(len(v) for s in samples for v in s.labels.values())}


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_monitor_sets_every_scrape_limit(backend: str) -> None:
    spec = monitor(body(backend, replicas={"min": 1, "max": 5}))["spec"]
    assert set(LIMIT_FIELDS) <= set(spec), sorted(spec)
    assert all(isinstance(spec[f], int) and spec[f] > 0 for f in LIMIT_FIELDS[:-1])
    assert byte_size(spec["bodySizeLimit"]) > 0
    # A rollout surges one pod beside the others (engine_deployment.ROLLING); twice the
    # most replicas leaves room for that and for a max lowered while the pods scale down.
    assert spec["targetLimit"] == 2 * 5


def test_render_all_carries_the_limits() -> None:
    b = body()
    assert set(LIMIT_FIELDS) <= set(render_all(b, parse_spec(b)).service_monitor["spec"])


def test_each_granted_client_raises_the_sample_limit_by_its_series() -> None:
    keys = [{"name": f"k{i}", "sha256": f"{i + 1:064x}", "maxClass": "p1"} for i in range(10)]
    plain = monitor(body())["spec"]["sampleLimit"]
    granted = monitor(body(clients={"keys": keys}))["spec"]["sampleLimit"]
    assert granted == plain + scrape_limits.MARGIN * scrape_limits.PER_CLIENT_SERIES * (
        len(keys) + 1)


def test_a_longer_model_name_raises_the_body_limit_not_the_sample_limit() -> None:
    short = monitor(body(model={"name": "m"}))["spec"]
    long = monitor(body(model={"name": "m" * MAX_MODEL_REF}))["spec"]
    assert long["sampleLimit"] == short["sampleLimit"]
    assert byte_size(long["bodySizeLimit"]) > byte_size(short["bodySizeLimit"])


def builtin_exposition(served_model_name: str) -> str:
    """A built-in engine's /metrics after traffic in every class, with an SLO judged
    (its verdict series) and the knobs exported, as a pod serves it."""
    with start_server(served_model_name=served_model_name) as srv:
        srv.backend.metrics.set_slo(SLOSpec.from_dict({}))
        for priority in ("p0", "p1", "p2") * 2:
            res = httpx.post(srv.url + "/v1/completions",
                             json={"prompt": "one two three", "max_tokens": 4,
                                   "priority": priority}, timeout=HANG_GUARD_S)
            assert res.status_code == 200
        srv.call(lambda e: None)  # the gauges settle when the engine goes idle
        return httpx.get(srv.url + "/metrics", timeout=HANG_GUARD_S).text


def test_the_builtin_engines_exposition_is_under_the_limits_with_the_margin() -> None:
    name = "m" * MAX_MODEL_REF  # the longest spec.model.name: every line carries it
    stats = exposition_stats(builtin_exposition(name))
    # The figure the limit is sized from still bounds what the engine exports.
    assert stats["samples"] <= scrape_limits.BUILTIN_SERIES, stats
    spec = monitor(body(model={"name": name}))["spec"]
    assert spec["sampleLimit"] >= scrape_limits.MARGIN * stats["samples"]
    assert byte_size(spec["bodySizeLimit"]) >= scrape_limits.MARGIN * stats["bytes"]
    assert spec["labelLimit"] >= stats["labels"] + SCRAPE_LABELS
    assert spec["labelNameLengthLimit"] >= 2 * stats["name_length"]
    assert spec["labelValueLengthLimit"] >= stats["value_length"] == MAX_MODEL_REF


def test_each_client_exports_at_most_its_series() -> None:
    # p1: two classes served and one refused, the most series a grant makes.
    keys = [{"name": f"client-{i}", "sha256": f"{i + 1:064x}", "maxClass": "p1"}
            for i in range(MAX_KEYS)]
    counts = ClientCounts("m")
    counts.set_clients(ClientClasses.from_dict({"keys": keys, "anonymous": {"maxClass": "p1"}}))
    series = sum(len(f.samples) for f in counts.collect())
    assert series <= scrape_limits.PER_CLIENT_SERIES * (MAX_KEYS + 1)


def test_the_meters_own_series_are_under_its_figure(tmp_path: Path) -> None:
    from tests.engine.meter.test_meter_render import streamed

    meter, _ = streamed(tmp_path)
    stats = exposition_stats(meter.render().decode())
    assert stats["samples"] <= scrape_limits.METER_SERIES, stats
    vllm = monitor(body("vllm"))["spec"]
    assert vllm["sampleLimit"] == scrape_limits.MARGIN * (
        scrape_limits.VLLM_SERIES + scrape_limits.METER_SERIES)


# prometheus-operator v0.64..v0.72's ServiceMonitor schema, as far as the operator writes
# it: every limit but bodySizeLimit (v0.73.0), which the API server prunes as it stores.
_OPEN = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
OLDER_MONITOR_SCHEMA = {"type": "object", "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
    "metadata": {"type": "object"},
    "spec": {"type": "object", "properties": {
        "selector": _OPEN, "namespaceSelector": _OPEN,
        "endpoints": {"type": "array", "items": _OPEN},
        **{f: {"type": "integer"} for f in LIMIT_FIELDS if f != "bodySizeLimit"}}}}}


def with_schema(crds: list[dict[str, Any]], kind: str,
                schema: dict[str, Any]) -> list[dict[str, Any]]:
    for crd in crds:
        if crd["spec"]["names"]["kind"] == kind:
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = schema
    return crds


def reconciled_twice(kube: RunningEmulator, cluster: Cluster,
                     crds: list[dict[str, Any]]) -> tuple[Outcome, Outcome]:
    kube.install(crd_manifest(), *crds)
    b = cluster.create(llmd())
    args = {"policy": OperatorPolicy(), "mint": operator_mint(cluster)}
    return reconcile(cluster.kube, b, **args), reconcile(cluster.kube, b, **args)


def test_an_older_crd_that_prunes_the_body_limit_is_not_patched_at_every_reconcile(
        kube: RunningEmulator, cluster: Cluster) -> None:
    first, second = reconciled_twice(
        kube, cluster, with_schema(monitoring_crds(), "ServiceMonitor", OLDER_MONITOR_SCHEMA))
    assert first.changes["ServiceMonitor/chat"] is Change.CREATED
    live = cluster.owned(MONITORING, "servicemonitors", "chat")["spec"]
    assert "bodySizeLimit" not in live and live["sampleLimit"] > 0  # pruned; the rest hold
    assert set(second.changes.values()) == {Change.UNCHANGED}
    assert drift_condition({"type": "Reconciled", "status": "True",
                            "reason": "OwnedObjectsInSync"}, second, 1) is None


def test_a_limit_edited_on_the_live_monitor_is_put_back(
        kube: RunningEmulator, cluster: Cluster) -> None:
    first, _ = reconciled_twice(kube, cluster, monitoring_crds())
    assert first.valid
    rendered = cluster.owned(MONITORING, "servicemonitors", "chat")["spec"]
    edit = {"sampleLimit": 10 ** 9, "bodySizeLimit": "1GiB", "targetLimit": 0}
    cluster.custom.patch_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NS, "servicemonitors", "chat", {"spec": edit})
    b = cluster.custom.get_namespaced_custom_object(
        "slopilot.dev", "v1alpha1", NS, "llmdeployments", "chat")
    again = reconcile(cluster.kube, b, policy=OperatorPolicy(), mint=operator_mint(cluster))
    assert again.changes["ServiceMonitor/chat"] is Change.PATCHED
    live = cluster.owned(MONITORING, "servicemonitors", "chat")["spec"]
    assert {f: live[f] for f in edit} == {f: rendered[f] for f in edit}


def test_a_limit_the_render_no_longer_holds_is_taken_off() -> None:
    b = body()
    desired = monitor(b)
    live = {**desired, "spec": {**desired["spec"]}}
    del desired["spec"]["sampleLimit"]
    assert removals(desired, live) == {"spec": {"sampleLimit": None}}
