"""spec.model.volume and spec.model.tokenSecret: the schema and parse_spec refuse what
could reach past the CR's namespace or its own claim, each naming the field and the fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slopilot.operator.crd import openapi_schema
from slopilot.operator.spec import SpecError, parse_spec
from tests.support.crd_schema import apply_defaults, cel_errors, prune, schema_errors

GOOD_VOLUME = {"claimName": "team-models", "subPath": "smollm2-135m"}


def body(backend: str = "builtin", **model: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team"},
            "spec": {"backend": backend, "model": {"name": "m", **model}}}


def errors_of(b: dict[str, Any]) -> list[str]:
    schema = openapi_schema()
    admitted = apply_defaults(schema, prune(schema, b))
    return schema_errors(schema, admitted) + cel_errors(schema, admitted)


def model_schema() -> dict[str, Any]:
    return dict(openapi_schema()["properties"]["spec"]["properties"]["model"])


def test_a_volume_is_a_claim_of_the_crs_namespace_and_nothing_else() -> None:
    volume = model_schema()["properties"]["volume"]
    # No hostPath, no other volume kind, no namespace: a claim is namespace-local.
    assert set(volume["properties"]) == {"claimName", "subPath"}
    assert volume["required"] == ["claimName"]
    assert "x-kubernetes-preserve-unknown-fields" not in volume
    secret = model_schema()["properties"]["tokenSecret"]
    assert set(secret["properties"]) == {"name", "key"}


def test_the_api_server_prunes_a_host_path_and_a_namespace() -> None:
    b = body(path="/models/m", volume={**GOOD_VOLUME, "hostPath": {"path": "/etc"},
                                       "namespace": "kube-system"})
    assert prune(openapi_schema(), b)["spec"]["model"]["volume"] == GOOD_VOLUME


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_good_sources_pass_the_schema_and_parse(backend: str) -> None:
    extra = {"tokenSecret": {"name": "hf-token"}} if backend == "vllm" else {}
    b = body(backend, path="/models/smollm2-135m", volume=GOOD_VOLUME, **extra)
    assert errors_of(b) == []
    spec = parse_spec(apply_defaults(openapi_schema(), b))
    assert spec.model_volume is not None and spec.model_volume.claim_name == "team-models"
    assert spec.model_volume.sub_path == "smollm2-135m"
    if backend == "vllm":
        assert spec.token_secret is not None
        assert (spec.token_secret.name, spec.token_secret.key) == ("hf-token", "token")


BAD = [
    ({"path": "/models/m", "volume": {"claimName": "Team_Models"}}, "model.volume.claimName"),
    ({"path": "/models/m", "volume": {"claimName": "a" * 254}}, "model.volume.claimName"),
    ({"path": "/models/m", "volume": {"claimName": "x", "subPath": "../other"}},
     "model.volume.subPath"),
    ({"path": "/models/m", "volume": {"claimName": "x", "subPath": "/etc"}},
     "model.volume.subPath"),
    ({"path": "/models/m", "volume": {"claimName": "x", "subPath": "a/../../b"}},
     "model.volume.subPath"),
    ({"path": "/opt/venv/lib", "volume": {"claimName": "x"}}, "/models"),
    ({"volume": {"claimName": "x"}}, "/models"),
    ({"path": "/models/../opt/venv", "volume": {"claimName": "x"}}, "/models"),
]


@pytest.mark.parametrize(("model", "needle"), BAD)
def test_the_schema_refuses_bad_volumes_by_name(model: dict[str, Any], needle: str) -> None:
    problems = errors_of(body(**model))
    assert any(needle in p for p in problems), problems


@pytest.mark.parametrize(("model", "needle"), BAD)
def test_parse_spec_refuses_them_too_naming_field_value_and_fix(model: dict[str, Any],
                                                                  needle: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(body(**copy.deepcopy(model)))
    assert any(needle in p and ("use" in p or "give" in p or "set" in p)
               for p in caught.value.problems), caught.value.problems


def test_parse_spec_refuses_fields_a_volume_does_not_have() -> None:
    # An object that reached the handler unpruned (another road than the API server).
    with pytest.raises(SpecError, match=r"spec\.model\.volume\.hostPath"):
        parse_spec(body(path="/models/m", volume={"claimName": "x", "hostPath": "/"}))


@pytest.mark.parametrize(("secret", "needle"), [
    ({"name": "HF"}, "model.tokenSecret.name"),
    ({"name": "hf", "key": "a/b"}, "model.tokenSecret.key"),
])
def test_bad_secret_references_are_refused(secret: dict[str, Any], needle: str) -> None:
    b = body("vllm", tokenSecret=secret)
    assert any(needle in p for p in errors_of(b)), errors_of(b)
    with pytest.raises(SpecError, match=needle.replace(".", r"\.")):
        parse_spec(b)


def test_the_builtin_engine_downloads_nothing_so_takes_no_token() -> None:
    b = body("builtin", tokenSecret={"name": "hf"})
    assert any("tokenSecret" in p for p in errors_of(b)), errors_of(b)
    with pytest.raises(SpecError, match="backend: vllm"):
        parse_spec(b)


def test_a_path_under_models_without_a_volume_warns() -> None:
    spec = parse_spec(body(path="/models/m"))
    assert any("spec.model.volume" in w for w in spec.warnings), spec.warnings
