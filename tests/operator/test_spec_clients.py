"""``spec.clients``: the classes each API key may name, judged by the CRD and the parser.

The CRD refuses most bad grants at the API server; ``parse_spec`` judges the rest (and
whatever came another way) with the engine's own parser, naming the field and the fix,
and a refused spec renders nothing. The render: test_render_clients.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.clients import ClientClasses
from slopilot.engine.request import Priority
from slopilot.operator.crd import openapi_schema
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.reconcile import Refusal, reconcile
from slopilot.operator.render import render_all
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.tokens import MIN_KEY_BYTES, TokenMint
from tests.support.client_keys import digest
from tests.support.crd_schema import (
    apply_defaults,
    cel_errors,
    list_map_errors,
    prune,
    schema_errors,
)

KEY_A, KEY_B = "sk-checkout-0123456789abcdef0123", "sk-reports-fedcba9876543210fedc"


def grants() -> dict[str, Any]:
    return {"keys": [{"name": "checkout", "sha256": digest(KEY_A), "maxClass": "p0",
                      "defaultClass": "p0"},
                     {"name": "reports", "sha256": digest(KEY_B), "maxClass": "p1",
                      "defaultClass": "p2"}],
            "anonymous": {"maxClass": "p2"}}


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team", "uid": "u-1"},
            "spec": {"model": {"name": "smollm2-135m", "path": "/models/smollm2"}, **spec}}


def rendered(**spec: Any) -> Any:
    b = body(**spec)
    return render_all(b, parse_spec(b), admin_token_sha256="ab" * 32)


def engine(out: Any) -> dict[str, Any]:
    return dict(out.deployment["spec"]["template"]["spec"]["containers"][0])


def problems_of(**spec: Any) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(body(**spec))
    return caught.value.problems


def refusals(**spec: Any) -> list[str]:
    """What the API server says to this CR: pruned, defaulted, then schema and CEL."""
    schema = openapi_schema()
    admitted = apply_defaults(schema, prune(schema, body(**spec)))
    return (schema_errors(schema, admitted) + cel_errors(schema, admitted)
            + list_map_errors(schema, admitted))


# -- parse -----------------------------------------------------------------------------


def test_a_spec_without_clients_has_none_and_renders_as_before() -> None:
    assert parse_spec(body()).clients is None
    assert parse_spec(body(clients=None)).clients is None
    plain, null = rendered(), rendered(clients=None)
    assert plain == null
    assert set(plain.config_map["data"]) == {"engine.json", "slo.json", "alerts.json"}
    assert "--clients" not in engine(plain)["command"]


def test_the_grants_are_parsed_by_the_engines_own_parser() -> None:
    spec = parse_spec(body(clients=grants()))
    assert spec.clients == ClientClasses.from_dict(grants())
    assert spec.clients is not None
    assert spec.clients.serve(f"Bearer {KEY_B}", None).priority is Priority.P2
    assert "clients" not in spec.extra


@pytest.mark.parametrize(("clients", "field", "fix"), [
    ({}, "spec.clients", "add keys, or anonymous"),
    ({"keys": []}, "spec.clients", "add keys, or anonymous"),
    ({"keys": [{"name": "a", "sha256": digest("a"), "maxClass": "p1"},
               {"name": "b", "sha256": digest("b"), "maxClass": "p1"},
               {"name": "c", "sha256": "0" * 63, "maxClass": "p1"}]},
     "spec.clients.keys[2].sha256", "64 hex digits"),
    ({"keys": [{"name": "a", "sha256": digest("a"), "maxClass": "p1", "defaultClass": "p0"}]},
     "spec.clients.keys[0].defaultClass", "more urgent than maxClass p1"),
    ({"anonymous": {"maxClass": "p4"}}, "spec.clients.anonymous.maxClass", "use 0, 1, 2"),
    ({"keys": [{"name": "a", "sha256": digest("a"), "maxClass": "p1"}] * 2},
     "spec.clients.keys[1].name", "give each key its own name"),
])
def test_bad_grants_are_refused_naming_the_field_and_the_fix(clients: Any, field: str,
                                                             fix: str) -> None:
    problems = problems_of(clients=clients)
    assert any(p.startswith(f"{field}: ") and fix in p for p in problems), problems


def test_vllm_refuses_grants_naming_the_field_and_the_fix() -> None:
    """vLLM's --api-key admits every key or none, and its meter judges every request in
    one class: no grant could be honoured there."""
    problems = problems_of(backend="vllm", clients=grants())
    assert any(p.startswith("spec.clients: ") and "backend: builtin" in p
               and "remove spec.clients" in p for p in problems), problems
    assert any("spec.clients" in r and "backend" in r
               for r in refusals(backend="vllm", clients=grants()))


def _deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(levels):
        node = {"a": node}
    return node


_KEY = {"name": "a", "sha256": digest("a"), "maxClass": "p1"}
HOSTILE: list[tuple[str, Any, str]] = [
    ("10,000 keys", {"keys": [{**_KEY, "name": f"k{i}", "sha256": digest(str(i))}
                              for i in range(10_000)]}, "spec.clients.keys"),
    ("clients a string", "p0", "spec.clients"),
    ("clients a list", [_KEY], "spec.clients"),
    ("clients a number", 7, "spec.clients"),
    ("keys an object", {"keys": _KEY}, "spec.clients.keys"),
    ("a key a string", {"keys": ["sk-live"]}, "spec.clients.keys[0]"),
    ("a name a number", {"keys": [{**_KEY, "name": 5}]}, "spec.clients.keys[0].name"),
    ("a sha256 a list", {"keys": [{**_KEY, "sha256": [digest("a")]}]},
     "spec.clients.keys[0].sha256"),
    ("a class an object", {"keys": [{**_KEY, "maxClass": {"p": 0}}]},
     "spec.clients.keys[0].maxClass"),
    ("a class a boolean", {"anonymous": {"maxClass": True}}, "spec.clients.anonymous.maxClass"),
    ("anonymous a string", {"anonymous": "p2"}, "spec.clients.anonymous"),
    ("a name with ../", {"keys": [{**_KEY, "name": "../../etc/passwd"}]},
     "spec.clients.keys[0].name"),
    ("a raw key for a digest", {"keys": [{**_KEY, "sha256": KEY_A}]},
     "spec.clients.keys[0].sha256"),
    ("an unknown field", {"keys": [{**_KEY, "tier": "gold"}]}, "spec.clients.keys[0].tier"),
    ("a name 1000 deep", {"keys": [{**_KEY, "name": _deep(1000)}]},
     "spec.clients.keys[0].name"),
    ("a sha256 1000 deep", {"keys": [{**_KEY, "sha256": _deep(1000)}]},
     "spec.clients.keys[0].sha256"),
    ("a class 1000 deep", {"anonymous": {"maxClass": _deep(1000)}},
     "spec.clients.anonymous.maxClass"),
    ("keys 1000 deep", {"keys": _deep(1000)}, "spec.clients.keys"),
    ("a key 1000 deep", {"keys": [_deep(1000)]}, "spec.clients.keys[0].a"),
    ("a name of 1 MB", {"keys": [{**_KEY, "name": "n" * 1_000_000}]},
     "spec.clients.keys[0].name"),
]


class _Untouchable:
    """A Kube no refused spec may reach: any call fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused spec reached the API: Kube.{name}")


@pytest.mark.parametrize(("clients", "field"), [(c, f) for _, c, f in HOSTILE],
                         ids=[i for i, _, _ in HOSTILE])
def test_a_hostile_clients_section_is_a_short_named_problem_and_nothing_rendered(
        clients: Any, field: str) -> None:
    problems = problems_of(clients=clients)
    assert any(p.startswith(f"{field}: ") for p in problems), problems
    assert all(len(p) < 400 for p in problems), [len(p) for p in problems]
    outcome = reconcile(_Untouchable(), body(clients=clients),  # type: ignore[arg-type]
                        policy=OperatorPolicy(), mint=TokenMint(bytes(MIN_KEY_BYTES)))
    assert outcome.refusal is Refusal.INVALID_SPEC and not outcome.valid
    assert outcome.changes == {}


# -- the CRD ---------------------------------------------------------------------------


def test_the_schema_admits_good_grants() -> None:
    assert refusals(clients=grants()) == []
    assert refusals(clients={"anonymous": {"maxClass": "p1", "defaultClass": "p1"}}) == []
    assert refusals(clients={"keys": [_KEY]}) == []


@pytest.mark.parametrize(("clients", "needle"), [
    ({"keys": [{**_KEY, "maxClass": "p3"}]}, "clients.keys.0.maxClass: 'p3' is not one of"),
    ({"keys": [{**_KEY, "maxClass": "P0"}]}, "clients.keys.0.maxClass: 'P0' is not one of"),
    ({"keys": [{**_KEY, "defaultClass": 1}]}, "clients.keys.0.defaultClass: 1 is not of type"),
    ({"keys": [{**_KEY, "name": "../x"}]}, "clients.keys.0.name: '../x' does not match"),
    ({"keys": [{**_KEY, "name": "a" * 64}]}, "clients.keys.0.name: 'aaa"),
    ({"keys": [{**_KEY, "name": "Team-A"}]}, "clients.keys.0.name: 'Team-A' does not match"),
    ({"keys": [{**_KEY, "sha256": KEY_A}]}, f"clients.keys.0.sha256: '{KEY_A}' does not match"),
    ({"keys": [{**_KEY, "sha256": digest("a") + "0"}]}, "clients.keys.0.sha256"),
    ({"keys": [{"name": "a", "maxClass": "p1"}]}, "'sha256' is a required property"),
    ({"keys": [{"name": "a", "sha256": digest("a")}]}, "'maxClass' is a required property"),
    ({"keys": [{"sha256": digest("a"), "maxClass": "p1"}]}, "'name' is a required property"),
    ({"anonymous": {"defaultClass": "p2"}}, "'maxClass' is a required property"),
    ({"keys": [{**_KEY, "name": f"k{i}", "sha256": digest(str(i))} for i in range(1025)]},
     "clients.keys: [{"),
    ({"keys": _KEY}, "clients.keys: {"),
    ({"keys": ["sk-live"]}, "clients.keys.0: 'sk-live' is not of type 'object'"),
    ("p0", "clients: 'p0' is not of type 'object'"),
    ({"anonymous": "p2"}, "clients.anonymous: 'p2' is not of type 'object'"),
    # The CEL rules: what the parser refuses across fields.
    ({"keys": [{**_KEY, "maxClass": "p1", "defaultClass": "p0"}]},
     "defaultClass must not be more urgent than maxClass"),
    ({"anonymous": {"maxClass": "p2", "defaultClass": "p1"}},
     "defaultClass must not be more urgent than maxClass"),
    ({"keys": [{**_KEY, "name": "anonymous"}]}, "'anonymous' names requests without a key"),
    ({"keys": [_KEY, {**_KEY, "sha256": digest("b")}]}, "clients.keys[1]: Duplicate value"),
    ({}, "no keys and no anonymous grant"),
    ({"keys": []}, "no keys and no anonymous grant"),
])
def test_the_schema_refuses_bad_grants_by_field(clients: Any, needle: str) -> None:
    problems = refusals(clients=clients)
    assert any(needle in p for p in problems), problems


def test_the_schema_lists_every_field_and_prunes_unknown_ones() -> None:
    clients = openapi_schema()["properties"]["spec"]["properties"]["clients"]
    keys = clients["properties"]["keys"]
    key = keys["items"]
    assert set(clients["properties"]) == {"keys", "anonymous"}
    assert set(key["properties"]) == {"name", "sha256", "maxClass", "defaultClass"}
    assert keys["maxItems"] == 1024
    # kubectl apply and server-side apply merge the list by name; the API server refuses
    # two keys of one name.
    assert keys["x-kubernetes-list-type"] == "map"
    assert keys["x-kubernetes-list-map-keys"] == ["name"]
    assert key["properties"]["name"]["maxLength"] == 63
    assert key["properties"]["sha256"]["pattern"] == "^[0-9a-fA-F]{64}$"
    for grant in (key, clients["properties"]["anonymous"]):
        for cls in ("maxClass", "defaultClass"):
            assert grant["properties"][cls]["enum"] == ["p0", "p1", "p2"]
    # Unknown fields are pruned, as everywhere in the spec: nothing under it keeps them.
    assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(clients)
    pruned = prune(openapi_schema(), body(clients={**grants(), "admins": ["x"],
                                                   "keys": [{**_KEY, "key": KEY_A}]}))
    assert pruned["spec"]["clients"] == {"keys": [_KEY], "anonymous": {"maxClass": "p2"}}
    text = json.dumps(clients).lower()
    assert "digest" in text and "never the key" in text


_NAMES = st.from_regex(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", fullmatch=True)
_DIGESTS = st.from_regex(r"^[0-9a-fA-F]{64}$", fullmatch=True)
_CLASSES = st.sampled_from(["p0", "p1", "p2"])


def _grant(extra: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({**extra, "maxClass": _CLASSES},
                                 optional={"defaultClass": _CLASSES})


@given(st.fixed_dictionaries({}, optional={
    "keys": st.lists(_grant({"name": _NAMES, "sha256": _DIGESTS}), max_size=4),
    "anonymous": _grant({})}))
@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_grants_the_schema_admits_the_parser_takes(clients: dict[str, Any]) -> None:
    """The schema is as tight as the parser but for one rule CEL cannot afford over 1024
    keys: two keys of one digest (the parser refuses them, naming both)."""
    if refusals(clients=clients):
        return
    try:
        parse_spec(body(clients=clients))
    except SpecError as exc:
        digests = [k["sha256"].lower() for k in clients.get("keys", [])]
        assert len(set(digests)) < len(digests), exc.problems


def test_the_samples_commented_grants_pass_the_schema_and_parse() -> None:
    """The sample shows spec.clients commented out (uncommented, every pod would need a
    key); uncommented, it must be grants the API server and the operator take."""
    sample = Path(__file__).parents[2] / "manifests" / "samples" / "llmdeployment-builtin.yaml"
    lines = sample.read_text(encoding="utf-8").splitlines()
    start = lines.index("  # clients:")
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  #   "):
            break
        block.append(line)
    clients = yaml.safe_load("\n".join(line.replace("# ", "", 1) for line in block))["clients"]
    assert refusals(clients=clients) == []
    spec = parse_spec(body(clients=clients))
    assert spec.clients is not None and [k.name for k in spec.clients.keys] == ["checkout"]
