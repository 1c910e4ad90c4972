"""The status keeps nothing nested deeper than the operator writes it.

kopf lists and watches every tenant's LLMDeployments in one stream, and the API server
serves a CR whole: what a status holds reaches the operator's JSON reader, which stops
at about 1,000 levels of nesting (Python's recursion limit) where the API server stores
up to 10,000. Under ``x-kubernetes-preserve-unknown-fields`` (``status.controller``,
``tunedConfig``, ``bestTrial``, ``config`` before) anyone with the status subresource
could store a value nested 1,000 levels deep (a few kilobytes): the list failed on it
with a RecursionError, kopf's watcher for the kind died, and the operator served no
LLMDeployment of any namespace again, across restarts too (the first list fails alike).
The schema now types every field the operator writes there: the API server prunes what
it does not declare and refuses a map where a value belongs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from slopilot.engine.config import EngineConfig
from slopilot.operator.crd import crd_manifest, openapi_schema
from slopilot.operator.kubeapi import ApiError
from slopilot.operator.reconcile import config_status
from slopilot.tuner.loop.backoff import Backoff
from slopilot.tuner.loop.settings import TwinCorrection
from slopilot.tuner.loop.state import (
    ControllerState,
    LoopState,
    PendingRestore,
    RunningTrial,
)
from slopilot.tuner.loop.twin_check import ClassError, TwinCheck
from tests.operator.operator_support import NS, Cluster, llmd
from tests.support.crd_schema import prune, schema_errors
from tests.support.kube_server import RunningEmulator

MAX_SCHEMA_DEPTH = 12
"""How deep the CR's schema may let any value nest: far below the ~1,000 levels Python's
JSON reader takes (the status's deepest field, a backoff's load mix, is at 8)."""


def schema_depth(schema: Mapping[str, Any]) -> float:
    """The deepest nesting a value of ``schema`` may have (inf: unbounded)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get(
            "x-kubernetes-int-or-string"):
        return math.inf
    children = [*(schema.get("properties") or {}).values(),
                *(schema[k] for k in ("items", "additionalProperties")
                  if isinstance(schema.get(k), Mapping))]
    return 1 + max((schema_depth(c) for c in children), default=0)


def value_depth(value: Any) -> int:
    if isinstance(value, Mapping):
        return 1 + max((value_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((value_depth(v) for v in value), default=0)
    return 0


def nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {"x": 1}
    for _ in range(depth):
        out = {"x": out}
    return out


def test_no_value_of_the_crd_nests_past_a_small_bound() -> None:
    status = openapi_schema()["properties"]["status"]
    for name, field in status["properties"].items():
        assert schema_depth(field) <= MAX_SCHEMA_DEPTH, f"status.{name} nests without bound"
    assert schema_depth(openapi_schema()) <= MAX_SCHEMA_DEPTH


DEEP = nested(60)


@pytest.mark.parametrize("status", [
    {"controller": {"junk": DEEP}},
    {"controller": {"baseline_config": {"token_budget": DEEP}}},
    {"controller": {"trial": {"config": {"junk": DEEP}}}},
    {"controller": {"twin": {"classes": {"p0": {"junk": DEEP}}}}},
    {"controller": {"backoff": {"situation": {"load": {"junk": DEEP}}}}},
    {"tunedConfig": {"engine": {"junk": DEEP}}},
    {"bestTrial": {"config": DEEP}},
    {"config": {"preemption": {"junk": DEEP}}},
], ids=lambda s: repr(s)[:60])
def test_a_deep_value_written_to_the_status_is_not_kept(
        kube: RunningEmulator, cluster: Cluster, status: dict[str, Any]) -> None:
    kube.install(crd_manifest())
    cluster.create(llmd())
    try:
        cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat",
                           {"status": status}, subresource="status")
    except ApiError as exc:  # refused: a map where the schema has a value
        assert exc.status == 422, exc
    assert value_depth(cluster.status()) <= MAX_SCHEMA_DEPTH


def _loop_state() -> LoopState:
    """A loop state with every field set, as the controller writes them."""
    config = EngineConfig().to_dict()
    twin = TwinCheck(at=1200.5, window_s=60.0, step_error=0.12, corrected_error=0.03,
                     correction=TwinCorrection.REFIT,
                     classes=(ClassError("p0", 80.0, 90.0, 20.0, 21.5),
                              ClassError("p1", None, 300.0, None, 40.0)),
                     trusted=True, reason="within 0.15", factors={"tokens": 1.2})
    backoff = Backoff({"replicas": 4, "config": config, "settings": "0123abcd",
                       "space": "4567ef01", "load": {"rate": 2.5, "prompt": 812.0,
                                                      "output": 190.0,
                                                      "mix": [0.2, 0.5, 0.3],
                                                      "requests": 150.0}},
                      until=5000.0, wait_s=1800.0)
    return LoopState(
        state=ControllerState.TUNING, since=1000.0, reason="alert SlopilotTTFTP99High",
        baseline_config=config, best_config={**config, "token_budget": 2048},
        best_goodput=1234.5,
        trial=RunningTrial(number=3, config={"token_budget": 512, "chunk_size": 256,
                                             "preemption_mode": "swap",
                                             "kv_watermark": 0.1},
                           started_at=1100.0, canary=True, repeats=1, warm=True,
                           canary_replica="chat-7d9f-abcde", edge_constraints=[-0.01, 0.2],
                           edge_goodput=900.0),
        episode_trials=4, episode_feasible=2, trial_starts=[900.0, 1000.0],
        episode_classes=["p0", "p1"], episode_measured=3, episode_warm_starts=2,
        episode_alerts=["SlopilotTTFTP99High[p0,critical]"], cooldown_until=4000.0,
        headroom_since=950.0, prometheus_unavailable=True, scale_reason="alert",
        twin=twin.to_dict(), backoff=backoff.to_dict(),
        pending_restore=PendingRestore(since=1150.0, attempts=2, retry_at=1210.0,
                                       error="chat-7d9f-abcde: timed out", trial=3))


def test_every_status_the_operator_writes_is_kept_whole() -> None:
    schema = openapi_schema()
    config = EngineConfig(token_budget=2048, chunk_size=1024).to_dict()
    digest_backoff = Backoff({"replicas": 1, "config": config, "settings": "s",
                              "space": "t", "load": {"digest": "89ab"}}, 1.0, 2.0)
    for status in (
            {"controller": _loop_state().to_dict()},
            {"controller": {**LoopState().to_dict(), "backoff": digest_backoff.to_dict()}},
            {"tunedConfig": {"engine": {"token_budget": 512}, "base": "0123456789abcdef",
                             "trial": True, "committed": config}},
            {"bestTrial": {"config": config, "goodputTokS": 1500.25}},
            {"config": config_status(EngineConfig())}):
        written = {k: _without_nulls(v) for k, v in status.items()}
        body = {**llmd(), "status": written}
        kept = prune(schema, body)
        assert kept["status"] == written
        assert schema_errors(schema, kept) == []


def _without_nulls(value: Any) -> Any:
    """As a merge patch leaves a value: its nulls deleted."""
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value
