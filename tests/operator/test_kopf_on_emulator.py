"""A real kopf operator process talks to the emulator over HTTP and its effects show."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="attr-defined,index"

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import kubernetes.client
from kopf.testing import KopfRunner

from slopilot.operator.crd import crd_manifest
from tests.operator.operator_support import wait_for
from tests.support.kube_server import RunningEmulator
from tests.support.waits import HANG_GUARD_S

OPERATOR = Path(__file__).parents[1] / "support" / "kopf_status_operator.py"
LLMD = ("slopilot.dev", "v1alpha1", "llmdeployments")


def test_kopf_operator_patches_status_posts_event_and_releases_finalizer(
        kube_login: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    kube_login.install(crd_manifest())
    api = kubernetes.client.CustomObjectsApi(kube_client)
    core = kubernetes.client.CoreV1Api(kube_client)
    args = ["run", "--standalone", "--all-namespaces", "--verbose", str(OPERATOR)]
    # A registry of its own: kopf's default one holds slopilot's handlers once any test in
    # this process has imported them, and they would answer the CR too.
    default, registry = kopf.get_default_registry(), kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)  # what kopf's default one has
    kopf.set_default_registry(registry)
    try:
        with KopfRunner(args, timeout=HANG_GUARD_S) as runner:
            _exercise(api, core)
    finally:
        kopf.set_default_registry(default)
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None


def _exercise(api: kubernetes.client.CustomObjectsApi, core: kubernetes.client.CoreV1Api
              ) -> None:
    api.create_namespaced_custom_object(*LLMD[:2], "default", LLMD[2], {
        "apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "tiny"}, "engine": {"tokenBudget": 2048}}})

    def status() -> dict[str, Any]:
        obj = api.get_namespaced_custom_object(*LLMD[:2], "default", LLMD[2], "demo")
        return dict(obj.get("status", {}))

    done = wait_for(lambda: status().get("phase") == "Running" and status(),
                    what="the handler's status patch")
    assert done["config"] == {"tokenBudget": 2048}
    obj = api.get_namespaced_custom_object(*LLMD[:2], "default", LLMD[2], "demo")
    assert "slopilot.dev/test-finalizer" in obj["metadata"]["finalizers"]
    assert obj["spec"]["engine"]["tokenBudget"] == 2048  # the status patch left spec alone
    events = wait_for(lambda: [e for e in core.list_namespaced_event("default").items
                               if e.reason == "Rendered"], what="the handler's event")
    assert events[0].involved_object.name == "demo"

    api.delete_namespaced_custom_object(*LLMD[:2], "default", LLMD[2], "demo")
    wait_for(lambda: not api.list_namespaced_custom_object(
        *LLMD[:2], "default", LLMD[2])["items"], what="kopf to release its finalizer")
