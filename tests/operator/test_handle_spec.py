"""The handle reads the LLMDeployment fresh on every call but parses each version once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slopilot.operator import kube_handle
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.tokens import MIN_KEY_BYTES, TokenMint
from tests.operator.operator_support import llmd


class _OneObject:
    """A Kube that holds one LLMDeployment and its Deployment; counts the reads."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.reads = body, 0

    def get(self, api: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        if plural == "deployments":
            return {"spec": {"replicas": 2}}
        self.reads += 1
        return copy.deepcopy(self.body)


def test_one_version_of_the_object_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = kube_handle.parse_spec

    def counting(body: Any) -> Any:
        parsed.append(body["metadata"].get("resourceVersion", "-"))
        return real(body)

    monkeypatch.setattr(kube_handle, "parse_spec", counting)
    body = llmd(engine={"tokenBudget": 768})
    body["metadata"]["resourceVersion"] = "7"
    kube = _OneObject(body)
    handle = KubeDeploymentHandle(kube, "default", "chat",  # type: ignore[arg-type]
                                  mint=TokenMint(bytes(MIN_KEY_BYTES)))
    # What one trial-start tick asks: the running config, the spec, the spec again.
    assert handle.current_config()["token_budget"] == 768
    assert handle.spec().engine.token_budget == 768
    assert handle.current_config()["token_budget"] == 768
    assert (kube.reads, parsed) == (3, ["7"])  # read fresh each time, parsed once
    kube.body["spec"]["engine"]["tokenBudget"] = 1280  # a user's edit: a new version
    kube.body["metadata"]["resourceVersion"] = "8"
    assert handle.spec().engine.token_budget == 1280 and parsed == ["7", "8"]
    del kube.body["metadata"]["resourceVersion"]  # no version to go by: parsed each time
    handle.spec()
    handle.spec()
    assert len(parsed) == 4
