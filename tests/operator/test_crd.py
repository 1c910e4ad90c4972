"""The CRD schema accepts the samples and refuses bad objects; parse_spec judges the rest."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.durations import parse_duration
from slopilot.operator.crd import crd_manifest, openapi_schema
from slopilot.operator.knobs import engine_checksum
from slopilot.operator.spec import Backend, Profile, SpecError, parse_spec
from slopilot.tuner.study.space import SearchSpace
from tests.support.crd_schema import apply_defaults, schema_errors

SAMPLES = Path(__file__).parents[2] / "manifests" / "samples"


def sample(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((SAMPLES / name).read_text(encoding="utf-8")))


def errors_of(body: dict[str, Any]) -> list[str]:
    schema = openapi_schema()
    return schema_errors(schema, apply_defaults(schema, body))


def with_spec(**changes: Any) -> dict[str, Any]:
    body = sample("llmdeployment-builtin.yaml")
    body["spec"] = {**copy.deepcopy(body["spec"]), **changes}
    return body


@pytest.mark.parametrize("name", ["llmdeployment-builtin.yaml", "llmdeployment-vllm.yaml"])
def test_samples_pass_the_schema_and_parse(name: str) -> None:
    body = sample(name)
    assert errors_of(body) == []
    spec = parse_spec(apply_defaults(openapi_schema(), body))
    assert spec.model_name == body["spec"]["model"]["name"]


@pytest.mark.parametrize(("change", "needle"), [
    ({"backend": "tpu"}, "backend: 'tpu' is not one of ['builtin', 'vllm']"),
    ({"engine": {"tokenBudget": 64}}, "engine.tokenBudget: 64 is less than the minimum of 128"),
    ({"engine": {"chunkSize": 20000}}, "engine.chunkSize: 20000 is greater than the maximum"),
    ({"engine": {"maxNumSeqs": 0}}, "engine.maxNumSeqs: 0 is less than the minimum of 1"),
    ({"engine": {"preemption": {"mode": "drop"}}}, "engine.preemption.mode: 'drop' is not one"),
    ({"engine": {"preemption": {"p0Utilization": 1.5}}}, "p0Utilization: 1.5 is greater"),
    ({"engine": {"budgetAlign": 100}}, "engine.budgetAlign: 100 is not one of [1, 64, 128, 256]"),
    ({"replicas": {"min": -1, "max": 2}}, "replicas.min: -1 is less than the minimum of 0"),
    ({"replicas": {"min": 0, "max": 0}}, "replicas.max: 0 is less than the minimum of 1"),
    ({"resources": {"gpu": -1}}, "resources.gpu: -1 is less than the minimum of 0"),
    ({"slo": {"profile": "lax"}}, "slo.profile: 'lax' is not one of"),
    ({"tuning": {"window": "two minutes"}}, "tuning.window: 'two minutes' does not match"),
    ({"model": {"path": "/m"}}, "model: 'name' is a required property"),
    ({"replicas": {"min": 1, "max": 512}}, "replicas.max: 512 is greater than the maximum of 64"),
    ({"resources": {"memory": "16GB"}}, "resources.memory: '16GB' does not match"),
    ({"resources": {"cpu": "four"}}, "resources.cpu: 'four' does not match"),
    ({"prometheus": {"url": "http://10.0.0.1:8080/?x="}}, "prometheus.url: 'http://10.0.0.1"),
    ({"prometheus": {"url": "http://u:p@prom:9090"}}, "prometheus.url: 'http://u:p@prom"),
    ({"tuning": {"storage": "postgresql://u@h/" + "x" * 3000}}, "tuning.storage: 'postgr"),
    ({"model": {"name": "m" * 600}}, "model.name: 'mmm"),
    ({"model": {"name": "m", "path": "/" + "m" * 600}}, "model.path: '/mmm"),
])
def test_schema_refuses_bad_fields_by_name(change: dict[str, Any], needle: str) -> None:
    problems = errors_of(with_spec(**change))
    assert any(needle in p for p in problems), problems


def test_schema_requires_a_spec_with_a_model() -> None:
    assert any("'spec' is a required property" in p for p in errors_of(
        {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment"}))


def test_knob_ranges_come_from_engine_config() -> None:
    engine = openapi_schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    meta = {f.name: f.metadata for f in dataclasses.fields(EngineConfig)}
    assert engine["tokenBudget"]["minimum"] == meta["token_budget"]["lo"] == 128
    assert engine["tokenBudget"]["maximum"] == meta["token_budget"]["hi"] == 16384
    assert (engine["chunkSize"]["minimum"], engine["chunkSize"]["maximum"]) == (64, 16384)
    assert (engine["maxNumSeqs"]["minimum"], engine["maxNumSeqs"]["maximum"]) == (1, 4096)
    assert engine["preemption"]["properties"]["mode"]["enum"] == [m.value for m in PreemptionMode]
    assert engine["kvWatermark"]["type"] == "number"
    assert engine["enablePrefixCaching"]["type"] == "boolean"


def test_crd_shape_cel_rules_columns_and_subresources() -> None:
    crd = crd_manifest()
    assert crd["metadata"]["name"] == "llmdeployments.slopilot.dev"
    assert crd["spec"]["names"]["shortNames"] == ["llmd"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Replicas", "Ready", "Budget", "Chunk", "TTFT P99", "TBT P99",
                       "SLO", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rules = [r["rule"] for key in ("replicas", "engine")
             for r in spec[key]["x-kubernetes-validations"]]
    assert "self.min <= self.max" in rules
    assert any("self.chunkSize <= self.tokenBudget" in r for r in rules)


def test_parse_spec_resolves_profile_presets_and_explicit_knobs() -> None:
    spec = parse_spec({"spec": {"model": {"name": "m"}, "slo": {"profile": "strict"},
                                "engine": {"maxNumSeqs": 64}}})
    assert spec.backend is Backend.BUILTIN and spec.slo.profile == Profile.STRICT
    assert (spec.engine.token_budget, spec.engine.chunk_size) == (512, 256)
    assert spec.engine.max_num_seqs == 64 and spec.explicit_knobs == {"max_num_seqs"}
    assert spec.slo.p1.tbt_p99_ms == 50
    assert spec.model_ref == "m"
    assert spec.tuning.window_s == 120.0


def test_parse_spec_runs_the_committed_tuned_config_while_it_belongs_to_the_spec() -> None:
    body: dict[str, Any] = {"spec": {"model": {"name": "m"}, "engine": {"tokenBudget": 768}}}
    body["status"] = {"tunedConfig": {"engine": {"token_budget": 2048, "chunk_size": 256},
                                      "base": engine_checksum(body)}}
    spec = parse_spec(body)
    assert (spec.engine.token_budget, spec.engine.chunk_size) == (2048, 256)
    assert spec.explicit_knobs == {"token_budget"}  # what the user wrote, not the tuning
    assert spec.tuning.space == SearchSpace.from_bounds(None, base=spec.engine)  # tune's
    body["spec"]["engine"]["tokenBudget"] = 1280  # edited since: the tuning is stale
    assert parse_spec(body).engine.token_budget == 1280
    body["status"]["tunedConfig"]["base"] = engine_checksum(body)
    body["status"]["tunedConfig"]["engine"]["token_budget"] = 99  # unfit: the spec's knobs
    assert parse_spec(body).engine.token_budget == 1280


@pytest.mark.parametrize(("spec", "needle"), [
    ({"replicas": {"min": 5, "max": 2}},
     "spec.replicas.min=5 exceeds spec.replicas.max=2: raise max or lower min"),
    ({"engine": {"tokenBudget": 512, "chunkSize": 1024}},
     "spec.engine.chunkSize=1024 exceeds spec.engine.tokenBudget=512"),
    ({"engine": {"chunkSize": 4096}}, "lower chunkSize or raise tokenBudget"),
    ({"slo": {"classes": {"p0": {"ttftP99Ms": 900}}}},
     "spec.slo.classes.p0.ttftP99Ms=900 is looser than p1.ttftP99Ms=500"),
    ({"tuning": {"bounds": {"tokenBudget": {"min": 4096, "max": 1024}}}},
     "spec.tuning.bounds.tokenBudget=[4096, 1024]: need 128 <= min <= max <= 16384"),
    ({"tuning": {"bounds": {"chunkSize": {"min": 64, "max": 128}}}},
     "lies outside spec.tuning.bounds.chunkSize"),
    ({"engine": {"preemption": {"mode": "drop"}}},
     "spec.engine.preemption.mode: preemption_mode='drop' is not allowed"),
    ({"engine": {"tokenBudget": "lots"}}, "spec.engine.tokenBudget: token_budget='lots'"),
    ({"tuning": {"window": "soon"}}, "spec.tuning.window: 'soon' is not a duration"),
    ({"prometheus": {"url": "prometheus:9090"}}, "the scheme must be http or https"),
    ({"replicas": {"min": 1, "max": 512}}, "spec.replicas.max=512 exceeds 64"),
    ({"resources": {"gpu": 100}}, "spec.resources.gpu=100: use 0..64"),
    ({"backend": "tpu"}, "spec.backend='tpu' is not allowed; use one of: builtin, vllm"),
    ({"replicas": {"min": 1, "max": "two"}}, "spec.replicas.max='two': expected int"),
])
def test_parse_spec_names_each_problem_and_its_fix(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"spec": {"model": {"name": "m"}, **spec}})
    assert any(needle in p for p in err.value.problems), err.value.problems


def test_parse_spec_takes_the_crd_s_own_maxima() -> None:
    """What the CRD's schema admits at its edge, the parser takes: a CR the API server
    stored is never refused for a bound the two draw one apart."""
    from slopilot.operator.spec import MAX_GPUS, MAX_REPLICAS

    spec = parse_spec({"spec": {"model": {"name": "m"}, "resources": {"gpu": MAX_GPUS},
                                "replicas": {"min": MAX_REPLICAS, "max": MAX_REPLICAS}}})
    assert spec.gpu == MAX_GPUS
    assert (spec.min_replicas, spec.max_replicas) == (MAX_REPLICAS, MAX_REPLICAS)


def test_parse_spec_collects_every_problem_at_once() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"spec": {"model": {}, "replicas": {"min": 3, "max": 1},
                             "resources": {"gpu": -2}}})
    assert len(err.value.problems) == 3
    assert str(err.value).count(";") == 2


def test_parse_spec_refuses_a_body_without_spec() -> None:
    with pytest.raises(SpecError, match="spec: missing"):
        parse_spec({"metadata": {"name": "x"}})


def test_parse_duration() -> None:
    assert parse_duration("1m30s") == 90.0 and parse_duration("500ms") == 0.5
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("2 minutes")


def test_preemption_mode_is_typed() -> None:
    spec = parse_spec({"spec": {"model": {"name": "m"},
                                "engine": {"preemption": {"mode": "swap"}}}})
    assert spec.engine.preemption_mode is PreemptionMode.SWAP


def test_a_string_no_bound_held_is_refused_short_not_quoted_whole() -> None:
    """spec.tuning.storage had no maxLength, and a refusal quoted it whole: a 100 KB URL
    made a 100 KB Valid condition, copied into status on every reconcile (a CR near the
    object size limit then had a status the API server refuses, retried every 10 s)."""
    from slopilot.operator.policy import OperatorPolicy, policy_problems

    for url in ("postgresql://u@h/" + "x" * 100_000,
                "sqlite:////var/lib/slopilot/" + "a" * 100_000 + ".db"):
        body = {"spec": {"model": {"name": "m"}, "tuning": {"storage": url}}}
        try:
            problems = policy_problems(parse_spec(body), OperatorPolicy(),
                                       namespace="default")
        except SpecError as exc:
            problems = exc.problems
        assert problems and all(len(p) < 1000 for p in problems), [len(p) for p in problems]
        assert any(p.startswith("spec.tuning.storage") for p in problems), problems


def _nodes(schema: Any, path: str = "spec") -> Any:
    if isinstance(schema, dict):
        yield path, schema
        for key, sub in (schema.get("properties") or {}).items():
            yield from _nodes(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            yield from _nodes(schema["items"], f"{path}[]")
        if isinstance(schema.get("additionalProperties"), dict):
            yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_every_string_a_cel_rule_reads_by_regex_or_parse_has_a_length_bound() -> None:
    """The API server prices each rule before it stores the CRD, a string's operations
    by its longest possible length: without maxLength that is the whole request (3 MB),
    and a regex over it can price the rule past the limit, so the CRD is refused at
    install. Every string a rule matches, parses or scans has its own bound."""
    spec = openapi_schema()["properties"]["spec"]
    costly = ("matches(", "duration(self)", "startsWith(", "contains(", "url(self)")
    unbounded = [path for path, node in _nodes(spec)
                 for rule in node.get("x-kubernetes-validations") or ()
                 if any(f"self.{c}" in rule["rule"] or c in rule["rule"] for c in costly)
                 and ("string" in (node.get("type"), *[a.get("type") for a in
                                                        node.get("anyOf") or ()]))
                 and "maxLength" not in node]
    assert unbounded == []
