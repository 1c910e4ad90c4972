"""A CR the schema accepts but whose owned objects the API server would refuse.

Reported once as ``Reconciled=False`` naming the CR's field, with nothing created and no
handler retry every 10 s; an API refusal the checks did not foresee is reported the same.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.kubeapi import ApiError
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Refusal, reconcile
from slopilot.operator.tokens import TokenMint
from tests.operator.operator_support import NS, Cluster, llmd, operator, wait_for
from tests.support.kube_server import RunningEmulator

MINT = TokenMint(b"k" * 32)
HANDLED = "slopilot.dev/last-handled-configuration"


@pytest.mark.parametrize(("name", "needle"), [
    ("a" * 70, "has 70 characters"),
    ("1chat", "starting with a letter"),
    ("chat.v2", "(no dots)"),
])
def test_a_name_no_service_can_have_is_one_condition_not_a_retry_loop(
        kube_login: RunningEmulator, cluster: Cluster, name: str, needle: str) -> None:
    with operator(kube_login):
        cluster.create(llmd(name, tuning={"enabled": False}))
        reconciled = wait_for(lambda: cluster.condition("Reconciled", name),
                              what="the Reconciled condition")
        assert reconciled["status"] == "False" and reconciled["reason"] == "OwnedObjectInvalid"
        assert reconciled["message"].startswith("metadata.name=") and needle in reconciled[
            "message"]
        assert cluster.status(name)["phase"] == "Invalid"
        assert cluster.condition("Valid", name)["status"] == "True"
        # kopf recorded the handler as done (no retry scheduled) and nothing was created.
        wait_for(lambda: HANDLED in (cluster.get(name)["metadata"].get("annotations") or {}),
                 what="the handler counted as done")
        annotations = cluster.get(name)["metadata"]["annotations"]
        assert not [k for k, v in annotations.items() if "retries" in v], annotations
        assert cluster.owned("apps/v1", "deployments", name) is None
        # kopf posts events from a queue of its own: the event may trail the annotation.
        assert wait_for(lambda: cluster.events("OwnedObjectInvalid"),
                        what="the OwnedObjectInvalid event")


def body(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": NS, "uid": "u-1", "generation": 1},
            "spec": {"model": {"name": "m"}, **spec}}


class Refusing:
    """A Kube that has nothing and refuses every create as the API server would."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.error = ApiError(status, reason, message)
        self.creates = 0

    def get(self, *_: Any) -> None:
        return None

    def serves(self, *_: Any) -> bool:
        return False

    def create(self, *_: Any) -> dict[str, Any]:
        self.creates += 1
        raise self.error


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("memory", "16GB", "(16Gi for binary units, 16G for decimal)"),
    ("cpu", "4 cores", "is not a Kubernetes quantity"),
    ("ephemeralStorage", "200GB", "(200Gi for binary units, 200G for decimal)"),
])
def test_a_quantity_the_api_server_refuses_names_the_field(
        field: str, value: str, needle: str) -> None:
    kube: Any = Refusing(422, "Invalid", "unused")
    outcome = reconcile(kube, body(resources={field: value}), policy=OperatorPolicy(),
                        mint=MINT)
    assert outcome.refusal is Refusal.OWNED_OBJECT_INVALID
    assert outcome.problems[0].startswith(f"spec.resources.{field}={value!r}")
    assert needle in outcome.problems[0] and kube.creates == 0


def test_a_refusal_no_check_foresaw_is_reported_not_retried() -> None:
    kube: Any = Refusing(422, "Invalid", 'ConfigMap "x" is invalid: something new')
    outcome = reconcile(kube, body(), policy=OperatorPolicy(), mint=MINT)
    assert outcome.refusal is Refusal.OWNED_OBJECT_INVALID
    assert outcome.problems[0].startswith("the API server refused ConfigMap/chat-engine")
    assert "something new" in outcome.problems[0]
    # A transient failure is not a refusal: it propagates, and kopf retries the handler.
    with pytest.raises(ApiError):
        reconcile(Refusing(503, "ServiceUnavailable", "later"), body(),  # type: ignore[arg-type]
                  policy=OperatorPolicy(), mint=MINT)
