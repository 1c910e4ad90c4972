"""A tenant's own PodDisruptionBudget of the CR's name is left alone (the
``DisruptionBudget=False ForeignBudget`` condition); once the tenant deletes it, the
operator makes its own within ``FOREIGN_BUDGET_S`` (its timer on such CRs), not at the
CR's next reconcile, which may be days away, and the condition clears."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes.client
import pytest

from slopilot.operator import handlers
from slopilot.operator.crd import KIND
from slopilot.operator.drift_repairs import DriftRepairs
from slopilot.operator.ownership import controlled_by
from slopilot.operator.settings import HANDLER_THREADS
from tests.operator.operator_support import Cluster, kopf_loop, llmd, with_namespaces
from tests.operator.test_drift_repairs import Kopf
from tests.support.kube_server import RunningEmulator

log = logging.getLogger("test")
NS = "team-a"
PDB = ("policy/v1", "poddisruptionbudgets")


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=HANDLER_THREADS, thread_name_prefix="kopf") as out:
        yield out


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The events a reconcile posts (kopf's posting needs its running context)."""
    out: list[tuple[str, str]] = []
    monkeypatch.setattr(handlers, "post_events", lambda body, outcome, *, reason: out.append(
        (body["metadata"]["name"], reason)))
    return out


def _their_budget() -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "chat", "namespace": NS},
            "spec": {"minAvailable": 1,
                     "selector": {"matchLabels": {"app.kubernetes.io/instance": "chat"}}}}


def test_a_deleted_foreign_budget_is_replaced_by_the_timer_and_the_condition_clears(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        threads: ThreadPoolExecutor, posted: list[tuple[str, str]]) -> None:
    a = with_namespaces(kube, Cluster(kube_client, NS), NS)
    a.kube.create(*PDB, NS, _their_budget())
    body = llmd()
    body["metadata"]["namespace"] = NS
    body = a.create(body)
    with kopf_loop() as loop:
        stand_in = Kopf(loop, threads, a, DriftRepairs(executor=threads))
        stand_in.handle(handlers.reconcile_spec, body=body, memo=stand_in.memo,
                        logger=log)
        stand_in.settled()
        said = a.condition("DisruptionBudget")
        assert said is not None and said["reason"] == "ForeignBudget", said
        status = a.get()["status"]
        assert handlers.foreign_budget(status=status)
        # Still there: the timer's look changes nothing.
        theirs = a.owned(*PDB, "chat")
        stand_in.handle(handlers.replace_deleted_budget, body=a.get(), memo=stand_in.memo,
                        logger=log)
        stand_in.settled()
        assert a.owned(*PDB, "chat") == theirs
        assert a.condition("DisruptionBudget") == said
        # Deleted: the next look makes the operator's own, and the condition clears.
        a.kube.delete(*PDB, NS, "chat")
        stand_in.handle(handlers.replace_deleted_budget, body=a.get(), memo=stand_in.memo,
                        logger=log)
        stand_in.settled()
    ours = a.owned(*PDB, "chat")
    assert ours is not None and controlled_by(ours, KIND, str(body["metadata"]["uid"]))
    assert ours["spec"]["maxUnavailable"] == 1
    assert a.condition("DisruptionBudget") is None
    assert not handlers.foreign_budget(status=a.get()["status"])


def test_the_timer_runs_only_on_crs_whose_budget_is_anothers() -> None:
    foreign = {"conditions": [{"type": "DisruptionBudget", "status": "False",
                               "reason": "ForeignBudget", "message": "..."}]}
    assert handlers.foreign_budget(status=foreign)
    assert not handlers.foreign_budget(status={})
    assert not handlers.foreign_budget(status={"conditions": [
        {"type": "Reconciled", "status": "False", "reason": "ForeignBudget"}]})
