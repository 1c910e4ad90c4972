"""What ``parse_spec`` refuses in one field (or in two of one section), the API server
refuses too, by the CRD's schema and CEL rules: a tenant's ``kubectl apply`` says no at
once, naming the field, instead of storing a CR the operator then marks Invalid.

Cross-field rules that depend on the profile's preset (a chunk over the preset's budget,
a class's target over the next class's default) stay the handler's alone, as the CRD's
description says; these do not.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from slopilot.operator.crd import openapi_schema
from slopilot.operator.reconcile import object_problems
from slopilot.operator.spec import SpecError, parse_spec
from tests.support.crd_schema import apply_defaults, cel_errors, prune, schema_errors


def admitted(spec: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The object as the API server stores it, and what it refuses in it."""
    schema = openapi_schema()
    body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "m"}, **spec}}
    stored = apply_defaults(schema, prune(schema, body))
    return stored, schema_errors(schema, stored) + cel_errors(schema, stored)


EMPTY_KEY = hashlib.sha256(b"").hexdigest()
REFUSED_BY_BOTH: list[tuple[dict[str, Any], str]] = [
    # The engine's first argument: an option, or no name at all.
    ({"model": {"name": "--trust-remote-code"}}, "model.name"),
    ({"model": {"name": "-m"}}, "model.name"),
    ({"model": {"name": "meta llama"}}, "model.name"),
    ({"model": {"name": "m\n--trust-remote-code"}}, "model.name"),
    ({"model": {"name": "m\x00"}}, "model.name"),
    ({"model": {"name": "m", "path": "--trust-remote-code"}}, "model.path"),
    ({"model": {"name": "m", "path": "/models/a b"}}, "model.path"),
    # A trial's window: 1 s to a day.
    ({"tuning": {"window": "0s"}}, "tuning.window"),
    ({"tuning": {"window": "500ms"}}, "tuning.window"),
    ({"tuning": {"window": "25h"}}, "tuning.window"),
    ({"tuning": {"window": "99999999999h"}}, "tuning.window"),
    # A trial's floor of requests per judged class, and its longest run: at least one
    # window, at most a day.
    ({"tuning": {"minClassRequests": 0}}, "tuning.minClassRequests"),
    ({"tuning": {"minClassRequests": 100_001}}, "tuning.minClassRequests"),
    ({"tuning": {"maxTrial": "25h"}}, "tuning.maxTrial"),
    ({"tuning": {"maxTrial": "0s"}}, "tuning.maxTrial"),
    ({"tuning": {"maxTrial": "90s"}}, "tuning"),  # under the default window, 2m
    ({"tuning": {"window": "30m", "maxTrial": "20m"}}, "tuning"),
    # The alert holds: whole seconds, at most a day; the breach window at least 60 s.
    ({"alerts": {"holdFor": "1500ms"}}, "alerts.holdFor"),
    ({"alerts": {"holdFor": "1.5s"}}, "alerts.holdFor"),
    ({"alerts": {"holdFor": "25h"}}, "alerts.holdFor"),
    ({"alerts": {"sustainedBreachWindow": "30s"}}, "alerts.sustainedBreachWindow"),
    ({"alerts": {"sustainedBreachWindow": "999999h"}}, "alerts.sustainedBreachWindow"),
    ({"alerts": {"sustainedBreachWindow": "90500ms"}}, "alerts.sustainedBreachWindow"),
    ({"alerts": {"waitingMin": 2**40}}, "alerts.waitingMin"),
    # The breach window at least the rate window: four scrapes, 1m at least.
    ({"alerts": {"scrapeInterval": "30s", "sustainedBreachWindow": "1m"}}, "alerts"),
    ({"alerts": {"scrapeInterval": "2m", "sustainedBreachWindow": "6m"}}, "alerts"),
    ({"alerts": {"scrapeInterval": "76s", "sustainedBreachWindow": "303s"}}, "alerts"),
    ({"alerts": {"ttftWarningFactor": 3}}, "alerts"),
    ({"alerts": {"ttftWarningFactor": 1.5, "ttftRetuneFactor": 1.2}}, "alerts"),
    # A Prometheus URL that names no port or no host.
    ({"prometheus": {"url": "http://prom:0"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://prom:000"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://prom:9090x/"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://prom:99999/"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://:9090"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://[::1:9090"}}, "prometheus.url"),
    # A host that is no DNS name: matched ``*.monitoring`` by its end.
    ({"prometheus": {"url": "http://evil.com\\.monitoring:9090"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://evil.com%2f.monitoring"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://prom_1.monitoring"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://prom..monitoring"}}, "prometheus.url"),
    ({"prometheus": {"url": "http://-prom.monitoring"}}, "prometheus.url"),
    ({"prometheus": {"url": f"http://{'a' * 64}.monitoring"}}, "prometheus.url"),
    # The digest of an empty key (KEY unset in `printf %s KEY | sha256sum`), in any case.
    ({"clients": {"keys": [{"name": "a", "sha256": EMPTY_KEY, "maxClass": "p1"}]}},
     "clients.keys[0]"),
    ({"clients": {"keys": [{"name": "a", "sha256": "b" * 64, "maxClass": "p0"},
                           {"name": "c", "sha256": EMPTY_KEY.upper(), "maxClass": "p1"}]}},
     "clients.keys[1]"),
    ({"clients": {"anonymous": {"maxClass": "p2"}, "keys": [
        {"name": "a", "sha256": EMPTY_KEY[:10].upper() + EMPTY_KEY[10:], "maxClass": "p1"}]}},
     "clients.keys[0]"),
    # vLLM's block sizes.
    ({"backend": "vllm", "engine": {"blockSize": 24}}, ""),
    # A SQLite database's own journal, WAL or shared memory file, as a database.
    ({"tuning": {"storage": "sqlite:////var/lib/slopilot/study.db-journal"}},
     "tuning.storage"),
    ({"tuning": {"storage": "sqlite:////var/lib/slopilot/team.db-wal"}}, "tuning.storage"),
    ({"tuning": {"storage": "sqlite+pysqlite:////d/team.db-shm?timeout=5"}},
     "tuning.storage"),
    # Where the pods may land: label values as the API server takes them (a key only
    # parse_spec judges: no CEL rule can bound a map key's length for its cost), a
    # toleration's operator and effect, a priority class's name, the startup budget.
    ({"scheduling": {"nodeSelector": {"gpu": "h100 80g"}}}, "scheduling.nodeSelector"),
    ({"scheduling": {"tolerations": [{"key": "a", "operator": "Sometimes"}]}},
     "scheduling.tolerations.0.operator"),
    ({"scheduling": {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}},
     "scheduling.tolerations[0]"),
    ({"scheduling": {"tolerations": [{"key": "a", "effect": "NoRun"}]}},
     "scheduling.tolerations.0.effect"),
    ({"scheduling": {"tolerations": [{"key": "a", "effect": "NoSchedule",
                                      "tolerationSeconds": 5}]}},
     "scheduling.tolerations[0]"),
    ({"scheduling": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
     "scheduling.tolerations[0]"),
    ({"scheduling": {"tolerations": [{"key": "bad key!"}]}},
     "scheduling.tolerations.0.key"),
    ({"scheduling": {"priorityClassName": "High_Priority"}}, "scheduling.priorityClassName"),
    ({"model": {"name": "m", "startupTimeout": "10s"}}, "model.startupTimeout"),
    ({"model": {"name": "m", "startupTimeout": "3h"}}, "model.startupTimeout"),
]


@pytest.mark.parametrize(("spec", "where"), REFUSED_BY_BOTH)
def test_what_parse_spec_refuses_the_api_server_refuses_too(spec: dict[str, Any],
                                                            where: str) -> None:
    stored, errors = admitted(spec)
    with pytest.raises(SpecError):
        parse_spec(stored)
    field = f"spec.{where}" if where else "spec:"  # "": a rule of the spec as a whole
    assert any(e.startswith(field) for e in errors), errors


ACCEPTED_BY_BOTH: list[dict[str, Any]] = [
    {"model": {"name": "meta-llama/Llama-3.1-8B", "path": "/models/llama-3.1-8b"}},
    {"model": {"name": "m", "path": ""}},
    {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}},
    {"tuning": {"window": "1s"}},
    {"tuning": {"window": "24h"}},
    {"tuning": {"window": "1m30s"}},
    {"tuning": {"window": "1500ms"}},
    {"tuning": {"minClassRequests": 1, "maxTrial": "2m"}},
    {"tuning": {"minClassRequests": 100_000, "maxTrial": "24h"}},
    {"tuning": {"window": "30m", "maxTrial": "30m"}},
    {"tuning": {"window": "24h"}},  # no maxTrial: the default is at least the window
    {"tuning": {"window": "90500ms", "maxTrial": "1h30m"}},
    {"alerts": {"holdFor": "0s", "sustainedBreachWindow": "60s"}},
    {"alerts": {"holdFor": "2000ms", "sustainedBreachWindow": "24h"}},
    {"alerts": {"holdFor": "1h30m", "waitingMin": 1_000_000_000}},
    {"alerts": {"ttftWarningFactor": 2, "ttftRetuneFactor": 2}},
    {"alerts": {"scrapeInterval": "30s", "sustainedBreachWindow": "2m"}},
    {"alerts": {"scrapeInterval": "76s", "sustainedBreachWindow": "304s"}},
    {"alerts": {"scrapeInterval": "76s"}},
    {"alerts": {"scrapeInterval": "1m30s"}},
    {"alerts": {"scrapeInterval": "2m"}},
    {"prometheus": {"url": "http://prom:65535/prefix"}},
    {"prometheus": {"url": "https://[::1]:9090"}},
    {"prometheus": {"url": "http://prom:080/"}},
    {"prometheus": {"url": "http://prom:/"}},
    {"prometheus": {"url": "http://Prom-1.Monitoring.svc.cluster.local.:9090"}},
    {"prometheus": {"url": f"http://{'a' * 63}.monitoring"}},
    {"prometheus": {"url": "http://10.0.0.7:9090"}},
    {"backend": "vllm", "engine": {"blockSize": 32}},
    {"backend": "builtin", "engine": {"blockSize": 24}},
    {"clients": {"keys": [{"name": "a", "sha256": hashlib.sha256(b"k").hexdigest().upper(),
                           "maxClass": "p1"}]}},
    {"tuning": {"storage": "sqlite:////var/lib/slopilot/wal-journal.db"}},
    {"tuning": {"storage": "postgresql://optuna@db-wal/studies-journal"}},
    {"scheduling": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                     "pool": ""},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"},
                                    {"key": "team", "value": "ml", "effect": "NoExecute",
                                     "tolerationSeconds": 0},
                                    {"operator": "Exists"}],
                    "priorityClassName": "inference-high"}},
    {"model": {"name": "m", "startupTimeout": "1m"}},
    {"model": {"name": "m", "startupTimeout": "2h"}},
    {"model": {"name": "m", "startupTimeout": "95s"}},
]


@pytest.mark.parametrize("spec", ACCEPTED_BY_BOTH)
def test_what_parse_spec_accepts_the_api_server_accepts(spec: dict[str, Any]) -> None:
    stored, errors = admitted(spec)
    assert errors == []
    parse_spec(stored)


@pytest.mark.parametrize(("resource", "value"), [
    ("cpu", "-1"), ("cpu", -2), ("memory", "-1Gi"), ("memory", "-0.5"), ("cpu", "-1e-3"),
    ("cpu", "-.5m"), ("ephemeralStorage", "-20Gi")])
def test_a_negative_resource_is_refused_by_name_before_anything_is_written(
        resource: str, value: Any) -> None:
    """The API server refuses a negative request or limit in the Deployment, after the
    ConfigMap was written, naming the Deployment's field; refused first, the CR's."""
    stored, errors = admitted({"resources": {resource: value}})
    assert any(e.startswith(f"spec.resources.{resource}") for e in errors), errors
    problems = object_problems(stored, parse_spec(stored))
    assert any(p.startswith(f"spec.resources.{resource}=") and "negative" in p
               for p in problems), problems


def test_zero_and_positive_resources_are_amounts() -> None:
    for resources in ({"cpu": 0, "memory": "0"}, {"cpu": "+1", "memory": "1.5Gi"},
                      {"cpu": "500m", "memory": 1024}, {"cpu": "-0", "memory": "-0Gi"},
                      {"cpu": "-0.0e5"}, {"ephemeralStorage": "20Gi"}):
        stored, errors = admitted({"resources": resources})
        assert errors == []
        assert object_problems(stored, parse_spec(stored)) == []
