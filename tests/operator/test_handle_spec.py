"""The handle reads the LLMDeployment fresh on every call but parses each version once."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slopilot.operator import kube_handle
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.spec import parse_spec
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
    # What one trial-start tick asks: the committed config, the spec, the spec again.
    assert handle.committed_config()["token_budget"] == 768
    assert handle.spec().engine.token_budget == 768
    assert handle.committed_config()["token_budget"] == 768
    assert (kube.reads, parsed) == (3, ["7"])  # read fresh each time, parsed once
    kube.body["spec"]["engine"]["tokenBudget"] = 1280  # a user's edit: a new version
    kube.body["metadata"]["resourceVersion"] = "8"
    assert handle.spec().engine.token_budget == 1280 and parsed == ["7", "8"]
    del kube.body["metadata"]["resourceVersion"]  # no version to go by: parsed each time
    handle.spec()
    handle.spec()
    assert len(parsed) == 4


@pytest.mark.parametrize("committed", [None, 1536], ids=["spec", "committed"])
def test_the_committed_config_leaves_a_recorded_trial_out(committed: int | None) -> None:
    """A trial on every replica is recorded in status.tunedConfig, the committed knobs
    beside it: the replicas run the trial's (``current_config``), the deployment keeps
    the committed ones (the spec's where none are)."""
    body = llmd(engine={"tokenBudget": 768})
    spec = parse_spec(body).engine
    trial = spec.with_overrides({"token_budget": 512}).to_dict()
    tuned: dict[str, Any] = {"engine": trial, "base": engine_checksum(body), "trial": True}
    if committed is not None:
        tuned["committed"] = spec.with_overrides({"token_budget": committed}).to_dict()
    body["status"] = {"tunedConfig": tuned}
    body["metadata"]["resourceVersion"] = "7"
    handle = KubeDeploymentHandle(_OneObject(body), "default", "chat",  # type: ignore[arg-type]
                                  mint=TokenMint(bytes(MIN_KEY_BYTES)))
    assert handle.current_config()["token_budget"] == 512
    assert handle.committed_config()["token_budget"] == (committed or 768)
    assert handle.current_config()["token_budget"] == 512  # the cached parse is the trial's
