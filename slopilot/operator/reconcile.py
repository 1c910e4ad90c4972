"""Bring the objects an LLMDeployment owns in line with its spec: create, or patch on a difference.

Idempotent by construction: each desired object is compared with the live one and patched
only where the live object does not already carry every desired field (the apiserver adds
defaults, so "covers" is a subset test, not equality). A second reconcile of an unchanged
spec therefore sends no writes at all.

Two things the controller owns survive a reconcile: the Deployment's replica count (kept
within the spec's range) and a committed tuned configuration (``status.tunedConfig``),
which applies while the spec's engine section is the one it was tuned from.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.operator.knobs import KNOB_PATHS
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.render import labels, owner_reference, render_all
from slopilot.operator.spec import Backend, LLMDeploymentSpec, SpecError, parse_spec
from slopilot.tuner.prometheus.rules import render_prometheus_rule, render_rules_yaml

MONITORING = "monitoring.coreos.com/v1"
RULES_FILE = "slopilot-rules.yaml"
PLURALS = {("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services",
           ("apps/v1", "Deployment"): "deployments",
           (MONITORING, "ServiceMonitor"): "servicemonitors",
           (MONITORING, "PrometheusRule"): "prometheusrules"}


class Change(enum.StrEnum):
    CREATED = "created"
    PATCHED = "patched"
    UNCHANGED = "unchanged"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconcile found and did; ``problems`` is non-empty for an invalid spec."""

    problems: tuple[str, ...] = ()
    changes: Mapping[str, Change] = dataclasses.field(default_factory=dict)  # "Kind/name"
    unsupported_knobs: tuple[str, ...] = ()
    monitoring: bool = False
    admin_secret: str | None = None
    admin_secret_found: bool = True
    replicas: int | None = None
    config: EngineConfig | None = None  # the knobs rendered (spec plus committed tuning)

    @property
    def valid(self) -> bool:
        return not self.problems


def plural_of(obj: Mapping[str, Any]) -> str:
    return PLURALS[(obj["apiVersion"], obj["kind"])]


def covers(live: Any, desired: Any) -> bool:
    """Whether ``live`` already carries every field of ``desired`` (lists element-wise)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and covers(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(covers(a, b) for a, b in zip(live, desired, strict=True)))
    return bool(live == desired)


def engine_checksum(body: Mapping[str, Any]) -> str:
    """Which spec a tuned config was tuned from: a hash of ``spec.engine`` and ``spec.slo``."""
    spec = body.get("spec") or {}
    payload = {"engine": spec.get("engine") or {}, "slo": spec.get("slo") or {}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tuned_config(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> EngineConfig:
    """The committed tuned knobs where they still belong to this spec, else the spec's."""
    tuned = (body.get("status") or {}).get("tunedConfig") or {}
    if tuned.get("base") != engine_checksum(body) or not isinstance(tuned.get("engine"), dict):
        return spec.engine
    try:
        return spec.engine.with_overrides(tuned["engine"])
    except ConfigError:
        return spec.engine  # written by an older operator with other knobs: start over


def effective_spec(body: Mapping[str, Any]) -> LLMDeploymentSpec:
    """parse_spec plus the committed tuned config; raises SpecError."""
    spec = parse_spec(body)
    return dataclasses.replace(spec, engine=tuned_config(body, spec))


def _owned_meta(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": body["metadata"]["namespace"],
            "labels": labels(body["metadata"]["name"]),
            "ownerReferences": [owner_reference(body)]}


def desired_objects(body: Mapping[str, Any], spec: LLMDeploymentSpec, *,
                    replicas: int | None, monitoring: bool) -> list[dict[str, Any]]:
    """Every object the deployment owns; the rules as a PrometheusRule or a plain ConfigMap."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    rendered = render_all(body, spec, replicas)
    objects = [rendered.config_map, rendered.deployment, rendered.service]
    if monitoring:
        rule = render_prometheus_rule(spec.slo, name, namespace, options=spec.alerts)
        rule["metadata"] = {**_owned_meta(body, rule["metadata"]["name"]),
                            "labels": {**rule["metadata"]["labels"], **labels(name)}}
        objects += [rendered.service_monitor, rule]
    else:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": _owned_meta(body, f"{name}-rules"),
                        "data": {RULES_FILE: render_rules_yaml(
                            spec.slo, name, namespace=namespace, options=spec.alerts)}})
    return objects


def ensure(kube: Kube, desired: Mapping[str, Any]) -> Change:
    """Create the object, or patch it where it differs; nothing is sent when it matches."""
    api, plural = desired["apiVersion"], plural_of(desired)
    meta = desired["metadata"]
    live = kube.get(api, plural, meta["namespace"], meta["name"])
    if live is None:
        try:
            kube.create(api, plural, meta["namespace"], desired)
            return Change.CREATED
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
            live = kube.get(api, plural, meta["namespace"], meta["name"]) or {}
    if covers(live, desired):
        return Change.UNCHANGED
    patch = copy.deepcopy({k: v for k, v in desired.items() if k not in ("apiVersion", "kind")})
    kube.patch(api, plural, meta["namespace"], meta["name"], patch)
    return Change.PATCHED


def current_replicas(kube: Kube, body: Mapping[str, Any], spec: LLMDeploymentSpec) -> int | None:
    """The live replica count clamped into the spec's range; None before the first create."""
    live = kube.get("apps/v1", "deployments", body["metadata"]["namespace"],
                    body["metadata"]["name"])
    if live is None:
        return None
    count = int((live.get("spec") or {}).get("replicas", 1))
    return min(max(count, spec.min_replicas), spec.max_replicas)


def reconcile(kube: Kube, body: Mapping[str, Any]) -> Outcome:
    """Parse, render and apply; an invalid spec touches nothing and says why."""
    try:
        spec = effective_spec(body)
    except SpecError as exc:
        return Outcome(problems=tuple(exc.problems))
    namespace = body["metadata"]["namespace"]
    monitoring = (kube.serves(MONITORING, "servicemonitors")
                  and kube.serves(MONITORING, "prometheusrules"))
    replicas = current_replicas(kube, body, spec)
    changes = {f"{obj['kind']}/{obj['metadata']['name']}": ensure(kube, obj)
               for obj in desired_objects(body, spec, replicas=replicas, monitoring=monitoring)}
    secret: str | None = None  # vLLM has no admin endpoint, hence no token
    found = True
    if spec.backend is Backend.BUILTIN:
        secret = spec.admin_secret or f"{body['metadata']['name']}-admin"
        found = kube.get("v1", "secrets", namespace, secret) is not None
    unsupported = render_all(body, spec, replicas).unsupported_knobs
    return Outcome(changes=changes, unsupported_knobs=unsupported, monitoring=monitoring,
                   admin_secret=secret, admin_secret_found=found,
                   replicas=replicas if replicas is not None else
                   min(max(spec.min_replicas, 1), spec.max_replicas), config=spec.engine)



def config_status(config: EngineConfig) -> dict[str, Any]:
    """The live knobs as users write them in spec.engine (camelCase, preemption nested)."""
    out: dict[str, Any] = {}
    values = config.to_dict()
    for path, name in KNOB_PATHS.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = values[name]
    return out
