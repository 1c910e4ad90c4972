"""A tenant's LLMDeployment, fuzzed: whatever it holds, a list of problems or objects the
API server and the pods accept, never a traceback in the operator.

Two kinds of spec: ones the CRD's schema admits (each field within its type, bounds,
enum and pattern, combined at random, so a min above its max, a budget below the seqs, a
vLLM block size vLLM refuses), which must give either ``SpecError`` or valid objects; and
ones it would not (a CRD applied from an older release, a schema-less test cluster, a
field of another type), which must give ``SpecError`` naming the field. What is rendered
must be plain JSON (no NaN, no Python objects), and the config the pods read at start
must be one the engine loads, as must every config the tuner may suggest from the
spec's bounds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import optuna
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.clients import ClientClasses
from slopilot.engine.config import EngineConfig
from slopilot.engine.slo import SLOSpec
from slopilot.operator.crd import openapi_schema
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.pod_layout import CLIENTS_FILE, CONFIG_FILE, SLO_FILE
from slopilot.operator.reconcile import desired_objects, object_problems, owned_names
from slopilot.operator.scheduling import LABEL_KEY_PATTERN
from slopilot.operator.spec import SpecError, parse_spec

Leaf = tuple[tuple[str, ...], Mapping[str, Any]]


def _leaves(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[Leaf]:
    if node.get("type") == "object" and "properties" in node:
        for key, child in node["properties"].items():
            yield from _leaves(child, (*path, key))
    else:
        yield path, node


SPEC_LEAVES = [(p, n) for p, n in _leaves(openapi_schema()) if p[:1] == ("spec",)]

_WINDOW = st.builds(lambda n, u: f"{n}{u}", st.integers(0, 100_000),
                    st.sampled_from(["ms", "s", "m", "h"]))
# A map's keys: label keys (a node selector's), and a few parse_spec refuses.
_LABEL_KEYS = st.from_regex(LABEL_KEY_PATTERN, fullmatch=True).filter(
    lambda k: len(k) <= 317) | st.sampled_from(["bad key!", "a/b/c", "", "-x"])
_QUANTITY = st.one_of(st.integers(-10**6, 10**20).map(str),
                      st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**6),
                                st.sampled_from(["", "m", "Mi", "Gi", "Ti", "k", "E"])),
                      st.sampled_from(["0.5", ".5", "1e3", "+1", "-1", "1E+30", "0"]))


def _in_schema(path: tuple[str, ...], node: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values the API server would store for this field."""
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    lo, hi = node.get("minimum"), node.get("maximum")
    if kind == "integer":
        return st.integers(lo if lo is not None else -2**63,
                           hi if hi is not None else 2**63 - 1)
    if kind == "number":
        return st.floats(lo if lo is not None else -1e308, hi if hi is not None else 1e308,
                         allow_nan=False, allow_infinity=False) | st.integers(
            int(lo) if lo is not None else -2**63, int(hi) if hi is not None else 2**63 - 1)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":  # spec.clients.keys: items drawn as the fields are
        return st.lists(_in_schema(path, node["items"]), max_size=min(node["maxItems"], 3))
    if kind == "object" and "properties" not in node:  # a map: spec.scheduling.nodeSelector
        return st.dictionaries(_LABEL_KEYS, _in_schema(path, node["additionalProperties"]),
                               max_size=min(node["maxProperties"], 3))
    if kind == "object":
        fields = {k: _in_schema((*path, k), v) for k, v in node["properties"].items()}
        required = set(node.get("required", ()))
        return st.fixed_dictionaries({k: v for k, v in fields.items() if k in required},
                                     optional={k: v for k, v in fields.items()
                                               if k not in required})
    if path[-1] in ("cpu", "memory"):
        return _QUANTITY
    if path[-1] in ("window", "holdFor", "sustainedBreachWindow", "startupTimeout"):
        return _WINDOW
    pattern = node.get("pattern")
    strings = st.from_regex(pattern, fullmatch=True) if pattern else st.text(max_size=64)
    return strings.filter(lambda s: len(s) <= node.get("maxLength", 4096))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)

_BASE: dict[str, Any] = {"model": {"name": "smollm2-135m"}}


def _put(spec: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = spec
    for key in path[1:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def _spec(draw: st.DrawFn, value_of: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(_BASE))
    for i in draw(st.lists(st.integers(0, len(SPEC_LEAVES) - 1), max_size=12)):
        path, node = SPEC_LEAVES[i]
        _put(spec, path, draw(value_of(path, node)))
    return spec


@st.composite
def schema_specs(draw: st.DrawFn) -> dict[str, Any]:
    return _spec(draw, _in_schema)


@st.composite
def any_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec = _spec(draw, lambda path, node: _JSON | _in_schema(path, node))
    # A section where a field was, or a field where a section was.
    for key in draw(st.lists(st.sampled_from(sorted({p[1] for p, _ in SPEC_LEAVES})),
                             max_size=2)):
        spec[key] = draw(_JSON)
    return spec


def _body(spec: Any, name: str = "chat") -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": "team-a", "uid": "u-1",
                         "generation": 1},
            "spec": spec}


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _check_objects(body: dict[str, Any]) -> None:
    try:
        spec = parse_spec(body)
    except SpecError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        return
    if object_problems(body, spec):
        return
    for monitoring in (True, False):
        objects = desired_objects(body, spec, replicas=spec.min_replicas,
                                  monitoring=monitoring, operator_namespace="slopilot")
        # Only these names' events reach a drift repair: one rendered outside them would
        # never be repaired.
        assert {(o["kind"], o["metadata"]["name"]) for o in objects} <= owned_names(
            body["metadata"]["name"])
        text = json.dumps(objects, allow_nan=False)  # plain JSON, as the API takes it
        assert json.loads(text) == objects
        for obj in objects:
            meta = obj["metadata"]
            assert len(meta["name"]) <= 253 and meta["namespace"] == "team-a"
            for value in meta.get("labels", {}).values():
                assert len(value) <= 63 and _LABEL_VALUE.match(value), value
            for rules in obj.get("data", {}).values():
                if rules.lstrip().startswith("groups"):
                    assert yaml.safe_load(rules)["groups"]
    config_map = next(o for o in objects if o["metadata"]["name"] == "chat-engine")
    # What the pods load at start (``slopilot serve --config``, ``--slo``).
    EngineConfig().with_overrides(json.loads(config_map["data"][CONFIG_FILE]))
    SLOSpec.from_dict(json.loads(config_map["data"][SLO_FILE]))
    if CLIENTS_FILE in config_map["data"]:  # ``--clients``
        ClientClasses.from_dict(json.loads(config_map["data"][CLIENTS_FILE]))
    # Every config the tuner may try, judged as the handle judges it before a PUT.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(3):
        config = spec.tuning.space.suggest(study.ask())
        spec.engine.with_overrides(config, live_only=True)


_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))


@given(schema_specs())
@_SETTINGS
def test_a_spec_the_schema_admits_parses_or_is_refused_with_reasons(spec: dict[str, Any]
                                                                     ) -> None:
    _check_objects(_body(spec))


_KNOB_NAMES = sorted(EngineConfig().to_dict())


_KNOBS = st.dictionaries(st.sampled_from(_KNOB_NAMES) | st.text(max_size=8),
                         _JSON | st.integers(0, 20_000), max_size=4)


@given(any_specs(), st.none() | _JSON | _KNOBS, st.booleans())
@_SETTINGS
def test_a_spec_the_schema_would_refuse_is_refused_with_reasons(
        spec: dict[str, Any], tuned: Any, of_this_spec: bool) -> None:
    # status.tunedConfig is the operator's, but a tenant granted the status subresource
    # (or an old release) can write anything there; the parse lays it over the knobs
    # where it names this spec's checksum.
    body = _body(spec)
    if of_this_spec and isinstance(spec, dict):
        tuned = {"base": engine_checksum(body), "engine": tuned}
    if tuned is not None:
        body["status"] = {"tunedConfig": tuned}
    _check_objects(body)


@given(_JSON)
@settings(max_examples=100, deadline=None, derandomize=True, database=None)
def test_a_spec_that_is_not_a_mapping_is_refused(spec: Any) -> None:
    _check_objects(_body(spec))
