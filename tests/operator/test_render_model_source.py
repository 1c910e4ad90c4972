"""Where the model comes from, rendered: a tenant's claim mounted read-only at /models, the
token of a gated model from a Secret, and the samples' pods able to load what they name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from slopilot.engine.models import REGISTRY
from slopilot.operator.crd import crd_manifest, openapi_schema
from slopilot.operator.kubeapi import Kube
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Change, reconcile
from slopilot.operator.render import render_all
from slopilot.operator.spec import parse_spec
from tests.operator.operator_support import NS, Cluster, operator_mint
from tests.support.crd_schema import apply_defaults
from tests.support.kube_server import RunningEmulator

KUBE_VERSION = "1.33.0"
SAMPLES = Path(__file__).parents[2] / "manifests" / "samples"
VOLUME = {"claimName": "team-models", "subPath": "smollm2-135m"}


def body(backend: str = "builtin", **model: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u-1"},
            "spec": {"backend": backend, "model": {"name": "smollm2-135m", **model}}}


def pod(b: dict[str, Any]) -> dict[str, Any]:
    return dict(render_all(b, parse_spec(b)).deployment["spec"]["template"]["spec"])


def engine(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return dict(next(c for c in pod_spec["containers"] if c["name"] == "engine"))


def model_arg(container: dict[str, Any]) -> str:
    line = container["command"] + container.get("args", [])
    return str(line[line.index("--model") + 1]) if "--model" in line else str(
        container["args"][0])


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_claim_is_mounted_read_only_at_models_and_the_engine_loads_the_path(
        backend: str) -> None:
    p = pod(body(backend, path="/models/smollm2-135m", volume=VOLUME))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "team-models",
                                                       "readOnly": True}} in p["volumes"]
    c = engine(p)
    assert {"name": "model", "mountPath": "/models", "subPath": "smollm2-135m",
            "readOnly": True} in c["volumeMounts"]
    assert model_arg(c) == "/models/smollm2-135m"
    # The meter never sees the weights (nor the token).
    for other in p["containers"]:
        if other["name"] != "engine":
            assert all(m["name"] != "model" for m in other["volumeMounts"])


def test_without_a_sub_path_the_whole_claim_is_mounted() -> None:
    c = engine(pod(body(path="/models", volume={"claimName": "weights"})))
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_no_volume_no_model_mount() -> None:
    p = pod(body())
    assert all(v["name"] != "model" for v in p["volumes"])
    assert all(m["mountPath"] != "/models" for m in engine(p)["volumeMounts"])


def test_a_gated_models_token_comes_from_the_namespaces_secret_to_vllm_only() -> None:
    p = pod(body("vllm", name="meta-llama/Meta-Llama-3-8B-Instruct",
                 tokenSecret={"name": "hf-token"}))
    token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                                "key": "token"}}}
    assert token in engine(p)["env"]
    meter = next(c for c in p["containers"] if c["name"] == "meter")
    assert all(e["name"] != "HF_TOKEN" for e in meter["env"])
    # A secretKeyRef has no namespace: the kubelet reads the pod's own namespace's.
    assert "namespace" not in token["valueFrom"]["secretKeyRef"]


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_a_pod_with_a_model_volume_validates_against_kubernetes(backend: str) -> None:
    b = body(backend, path="/models/m", volume=VOLUME,
             **({"tokenSecret": {"name": "hf", "key": "hf-token"}} if backend == "vllm"
                else {}))
    kubernetes_validate.validate(render_all(b, parse_spec(b)).deployment, KUBE_VERSION,
                                 strict=True)


def sample(name: str) -> dict[str, Any]:
    b = apply_defaults(openapi_schema(), yaml.safe_load((SAMPLES / name).read_text()))
    b["metadata"].update(namespace=NS, uid="u-1")
    return dict(b)


def loadable_in_the_image(container: dict[str, Any], mounts: list[str]) -> bool:
    """What the built-in engine can load in the shipped image: a registered model (built
    into the image), or a path under a volume the pod mounts."""
    ref = model_arg(container)
    return ref in REGISTRY or any(ref == m or ref.startswith(m.rstrip("/") + "/")
                                  for m in mounts)


def test_the_builtin_sample_runs_a_model_the_image_can_load() -> None:
    c = engine(pod(sample("llmdeployment-builtin.yaml")))
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    assert loadable_in_the_image(c, mounts), (model_arg(c), mounts)


def test_the_samples_volume_variant_mounts_what_it_names() -> None:
    b = sample("llmdeployment-builtin.yaml")
    b["spec"]["model"].update(path="/models/smollm2-135m", volume=VOLUME)
    c = engine(pod(b))
    assert model_arg(c) == "/models/smollm2-135m"
    assert loadable_in_the_image(c, [m["mountPath"] for m in c["volumeMounts"]])


def test_drift_repair_puts_the_model_volume_back(kube: RunningEmulator,
                                                 cluster: Cluster) -> None:
    kube.install(crd_manifest())
    b = body(path="/models/smollm2-135m", volume=VOLUME)
    b["metadata"] = {"name": "chat", "namespace": NS}
    created = cluster.create(b)
    k = Kube(cluster.custom.api_client)
    args: dict[str, Any] = {"policy": OperatorPolicy(), "mint": operator_mint(cluster)}
    assert reconcile(k, created, **args).valid
    second = reconcile(k, created, **args)
    assert set(second.changes.values()) == {Change.UNCHANGED}, second.changes
    dep = k.get("apps/v1", "deployments", NS, "chat")
    spec = dep["spec"]["template"]["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "model"]
    spec["containers"][0]["volumeMounts"] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] != "model"]
    k.patch("apps/v1", "deployments", NS, "chat", {"spec": {"template": {"spec": {
        "volumes": spec["volumes"], "containers": spec["containers"]}}}})
    reconcile(k, created, **args)  # what the repair does on the MODIFIED event
    after = k.get("apps/v1", "deployments", NS, "chat")["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "team-models",
                                                       "readOnly": True}} in after["volumes"]
    assert any(m["name"] == "model" and m["readOnly"]
               for m in after["containers"][0]["volumeMounts"])
