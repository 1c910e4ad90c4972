"""The images the operator picks are the administrator's to name (settings.py).

An air-gapped cluster mirrors every image into its own registry: the meter in each vLLM
pod, and each backend's default engine image (what a CR without ``spec.image`` runs),
must come from there. They are named on the operator, never in a CR: the meter judges
its own tenant's goodput, so a tenant who picked its image could pick the verdicts.
"""

# CustomObjectsApi (client 37) returns ``object``; owned objects may be None.
# mypy: disable-error-code="index,union-attr"

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from slopilot.operator.crd import crd_manifest
from slopilot.operator.images import DEFAULT_IMAGES, METER_IMAGE
from slopilot.operator.policy import PolicyError, policy_problems
from slopilot.operator.reconcile import reconcile
from slopilot.operator.settings import (
    BUILTIN_IMAGE_ENV,
    METER_IMAGE_ENV,
    VLLM_IMAGE_ENV,
    operator_policy,
)
from slopilot.operator.spec import Backend, parse_spec
from tests.operator.operator_support import Cluster, llmd, operator_mint
from tests.support.kube_server import RunningEmulator

MIRROR = "registry.acme.internal/mirror"
MIRRORED = {METER_IMAGE_ENV: f"{MIRROR}/slopilot:0.1.0",
            BUILTIN_IMAGE_ENV: f"{MIRROR}/slopilot:0.1.0-cuda",
            VLLM_IMAGE_ENV: f"{MIRROR}/vllm-openai:v0.11.0"}


@pytest.fixture
def cluster(kube: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> Cluster:
    kube.install(crd_manifest())
    return Cluster(kube_client)


def pod_images(cluster: Cluster, body: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """Each container's image in the Deployment the reconcile makes under ``env``."""
    out = reconcile(cluster.kube, body, policy=operator_policy(env),
                    mint=operator_mint(cluster))
    assert out.valid, out.problems
    deployment = cluster.owned("apps/v1", "deployments", body["metadata"]["name"])
    return {c["name"]: c["image"]
            for c in deployment["spec"]["template"]["spec"]["containers"]}


def test_a_vllm_pods_meter_and_engine_run_the_images_the_administrator_names(
        cluster: Cluster) -> None:
    body = cluster.create(llmd(backend="vllm"))
    assert pod_images(cluster, body, MIRRORED) == {
        "engine": MIRRORED[VLLM_IMAGE_ENV], "meter": MIRRORED[METER_IMAGE_ENV]}


def test_a_builtin_pod_runs_the_default_image_the_administrator_names(
        cluster: Cluster) -> None:
    body = cluster.create(llmd())
    assert pod_images(cluster, body, MIRRORED) == {"engine": MIRRORED[BUILTIN_IMAGE_ENV]}


def test_a_meter_not_named_runs_the_builtin_image_the_administrator_names(
        cluster: Cluster) -> None:
    """The meter is slopilot, as the built-in engine's image is: an air-gapped cluster
    that mirrored only that one had every vLLM pod pull the shipped meter from a registry
    it cannot reach (ImagePullBackOff)."""
    body = cluster.create(llmd(backend="vllm"))
    only = {BUILTIN_IMAGE_ENV: MIRRORED[BUILTIN_IMAGE_ENV]}
    assert pod_images(cluster, body, only)["meter"] == MIRRORED[BUILTIN_IMAGE_ENV]


def test_unset_the_shipped_images_run(cluster: Cluster) -> None:
    body = cluster.create(llmd(backend="vllm"))
    assert pod_images(cluster, body, {}) == {"engine": DEFAULT_IMAGES[Backend.VLLM],
                                             "meter": METER_IMAGE}


def test_a_crs_image_changes_the_engines_container_never_the_meters(
        cluster: Cluster) -> None:
    own = f"{MIRROR}/vllm-openai:team-a-build"
    body = cluster.create(llmd(backend="vllm", image=own))
    assert pod_images(cluster, body, MIRRORED) == {"engine": own,
                                                   "meter": MIRRORED[METER_IMAGE_ENV]}


def test_the_default_allow_list_is_the_administrators_default_images() -> None:
    # Unset, SLOPILOT_ALLOWED_IMAGES lists the backends' default images' repositories:
    # those named on the operator, or a CR without spec.image would be refused its own
    # backend's default.
    policy = operator_policy(MIRRORED)
    for backend in Backend:
        spec = parse_spec({"spec": {"model": {"name": "m"}, "backend": backend.value}})
        assert policy_problems(spec, policy, namespace="default") == []
    assert policy.image_allowed(f"{MIRROR}/vllm-openai:v0.12.0")
    assert not policy.image_allowed("vllm/vllm-openai:v0.11.0")


@pytest.mark.parametrize("variable", [METER_IMAGE_ENV, BUILTIN_IMAGE_ENV, VLLM_IMAGE_ENV])
@pytest.mark.parametrize("value", ["Not An Image", f"{MIRROR}/slopilot:", f"{MIRROR}/a b:1",
                                   f" {MIRROR}/slopilot:0.1.0", "-v:1"])
def test_an_image_that_is_no_reference_stops_the_start_naming_the_variable(
        variable: str, value: str) -> None:
    with pytest.raises(PolicyError) as info:
        operator_policy({variable: value})
    message = str(info.value)
    assert message.startswith(f"{variable}={value!r} is not a container image reference")
    assert "registry/path:tag" in message and "unset it" in message


@pytest.mark.parametrize("variable", [METER_IMAGE_ENV, BUILTIN_IMAGE_ENV, VLLM_IMAGE_ENV])
def test_a_blank_image_variable_is_unset(variable: str) -> None:
    assert operator_policy({variable: " "}).images == operator_policy({}).images
