"""A ``status.controller`` the operator cannot read stops the controller, by name.

The daemon resumes from the loop state it saved in the status; whoever may write the
status can put anything there. The controller does not start (Tuning=False,
ControllerUnavailable, naming the field), where a TypeError used to escape the step and
kopf retried it forever with no condition written. The CRD's status schema types the loop
state, so the API server refuses most such writes itself (``test_status_depth.py``); a
status stored under an older CRD, whose ``status.controller`` was free-form, still
reaches the operator's own check.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import ApiError
from tests.operator.operator_support import NS, Cluster, daemon_loop, llmd
from tests.support.kube_server import RunningEmulator

WRONG_TYPES = [({"trial_starts": ["x"]}, "trial_starts"), ({"since": "yesterday"}, "since"),
               ({"trial_starts": 5}, "trial_starts"),
               ({"trial": {"number": "1"}}, "trial.number")]


def older_crd() -> dict[str, Any]:
    """The CRD as it was before its status was typed: ``status.controller`` free-form."""
    crd = copy.deepcopy(crd_manifest())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    status["properties"]["controller"] = {"type": "object",
                                          "x-kubernetes-preserve-unknown-fields": True}
    return crd


@pytest.mark.parametrize(("saved", "field"), WRONG_TYPES)
def test_the_api_server_refuses_a_saved_state_of_the_wrong_types(
        kube: RunningEmulator, kube_client: Any, saved: dict[str, Any], field: str) -> None:
    kube.install(crd_manifest())
    cluster = Cluster(kube_client)
    cluster.create(llmd())
    with pytest.raises(ApiError) as refused:
        cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat",
                           {"status": {"controller": saved}}, subresource="status")
    assert refused.value.status == 422
    assert f"status.controller.{field}" in refused.value.message


@pytest.mark.parametrize(("saved", "field"), [
    *WRONG_TYPES, ({"episode_trials": -1000}, "episode_trials")])
def test_a_saved_state_of_the_wrong_types_is_named_in_the_tuning_condition(
        kube: RunningEmulator, kube_client: Any, monkeypatch: pytest.MonkeyPatch,
        saved: dict[str, Any], field: str) -> None:
    kube.install(older_crd())
    cluster = Cluster(kube_client)
    body = cluster.create(llmd(prometheus={"url": "http://127.0.0.1:9"}))
    cluster.kube.patch("slopilot.dev/v1alpha1", "llmdeployments", NS, "chat",
                       {"status": {"controller": saved}}, subresource="status")
    loop = daemon_loop(cluster, body, monkeypatch)
    assert loop.step() is True and loop.controller is None
    tuning = cluster.condition("Tuning")
    assert tuning is not None and tuning["reason"] == "ControllerUnavailable"
    assert f"controller state: {field}=" in tuning["message"]
    # and how to start afresh, where the status is not the tenant's to write
    assert f"kubectl -n {NS} patch llmdeployment chat --subresource=status" \
        in tuning["message"]
