"""A deleted tuning CR is let go as soon as its daemon has ended its trial and study.

kopf gives a stopping daemon its ``cancellation_backoff`` (15 s for the tuning daemon)
and, where it had not ended within kopf's "instant exit" wait, looked again only then,
with a touch of the CR (its ``touch-dummy`` annotation): each finalizer was released
about 15 s after the deletion's work was done, each namespace's deletion waiting on it.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from slopilot.operator.crd import crd_manifest
from tests.operator.operator_support import Cluster, llmd, wait_for
from tests.operator.test_operator_rbac import MANIFESTS, Operator
from tests.operator.test_peering_keeper import namespace, start_operator
from tests.support.kube_server import RunningEmulator


@pytest.fixture
def operator(kube: RunningEmulator, tmp_path: Path) -> Iterator[Operator]:
    kube.install(crd_manifest(), *yaml.safe_load_all(
        (MANIFESTS / "kopf-peering.yaml").read_text(encoding="utf-8")),
        namespace("slopilot-system"))
    op = start_operator(kube, tmp_path, "--all-namespaces", "--standalone")
    yield op
    if op.proc.poll() is None:
        op.proc.kill()
    op.proc.wait()
    print(f"--- operator ---\n{op.output()}")  # shown when the test fails
    op.log.close()


def touches(kube: RunningEmulator, name: str) -> list[object]:
    return [r.data for r in list(kube.emulator)
            if r.method.value == "PATCH" and r.resource is not None
            and r.resource.plural == "llmdeployments" and r.name == name
            and "touch-dummy" in str(r.data)]


def test_a_deleted_tuning_cr_is_released_once_its_daemon_ended(
        kube: RunningEmulator, kube_client: kubernetes.client.ApiClient,
        operator: Operator) -> None:
    cluster = Cluster(kube_client)
    cluster.create(llmd())
    wait_for(lambda: "chat: controller built" in operator.output(),
             what="the tuning daemon's controller")
    cluster.custom.delete_namespaced_custom_object(
        "slopilot.dev", "v1alpha1", "default", "llmdeployments", "chat")

    def gone() -> bool:
        try:
            cluster.get()
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False
    wait_for(gone, what="the CR released and gone")
    assert touches(kube, "chat") == [], "released only at kopf's second look"
    assert operator.stop() == 0, operator.output()
