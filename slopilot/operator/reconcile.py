"""Bring the objects an LLMDeployment owns in line with its spec: create, or patch on a difference.

Idempotent by construction: each desired object is compared with the live one and patched
only where the live object does not already carry every desired field (the apiserver adds
defaults, so "covers" is a subset test, not equality). A second reconcile of an unchanged
spec therefore sends no writes at all.

Two things the controller owns survive a reconcile: the Deployment's replica count (kept
within the spec's range) and a committed tuned configuration (``status.tunedConfig``),
which ``parse_spec`` lays over the spec's knobs while the spec's engine section is the one
it was tuned from.

A spec is refused, touching nothing, when it fails ``parse_spec`` (InvalidSpec), the
administrator's policy (NotAllowed), or would render objects the API server refuses
(OwnedObjectInvalid: checked first and named by the CR's field; an API refusal that
slipped past the checks is reported the same way rather than retried every 10 s).

The admin-token Secret is write-only to the operator (tokens.py): it is created when the
status does not yet record it (or at a resume, in case it was deleted), never read.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.operator.knobs import KNOB_PATHS
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.policy import OperatorPolicy, policy_problems
from slopilot.operator.render import labels, owner_reference, render_admin_secret, render_all
from slopilot.operator.spec import Backend, LLMDeploymentSpec, SpecError, parse_spec
from slopilot.operator.tokens import TokenMint, admin_secret_name
from slopilot.operator.validation import deployment_name_problem, quantity_problem
from slopilot.tuner.prometheus.rules import render_prometheus_rule, render_rules_yaml

MONITORING = "monitoring.coreos.com/v1"
RULES_FILE = "slopilot-rules.yaml"
PLURALS = {("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services",
           ("v1", "Secret"): "secrets", ("apps/v1", "Deployment"): "deployments",
           ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
           (MONITORING, "ServiceMonitor"): "servicemonitors",
           (MONITORING, "PrometheusRule"): "prometheusrules"}


class Change(enum.StrEnum):
    CREATED = "created"
    PATCHED = "patched"
    UNCHANGED = "unchanged"


class Refusal(enum.StrEnum):
    """Why a reconcile touched nothing; also the status condition's reason."""

    INVALID_SPEC = "InvalidSpec"  # Valid=False
    NOT_ALLOWED = "NotAllowed"  # Valid=False: the operator's policy
    OWNED_OBJECT_INVALID = "OwnedObjectInvalid"  # Reconciled=False


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconcile found and did; ``problems`` is non-empty for an invalid spec."""

    problems: tuple[str, ...] = ()
    refusal: Refusal = Refusal.INVALID_SPEC
    """Why, when ``problems`` is not empty."""
    changes: Mapping[str, Change] = dataclasses.field(default_factory=dict)  # "Kind/name"
    unsupported_knobs: tuple[str, ...] = ()
    monitoring: bool = False
    admin_secret: str | None = None
    """The admin-token Secret the pods read (builtin only); created by the operator."""
    replicas: int | None = None
    config: EngineConfig | None = None  # the knobs rendered (spec plus committed tuning)
    warnings: tuple[str, ...] = ()
    """The parsed spec's warnings (a deprecated field): posted, never refused."""

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



def _owned_meta(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": body["metadata"]["namespace"],
            "labels": labels(body["metadata"]["name"]),
            "ownerReferences": [owner_reference(body)]}


def desired_objects(body: Mapping[str, Any], spec: LLMDeploymentSpec, *,
                    replicas: int | None, monitoring: bool,
                    operator_namespace: str) -> list[dict[str, Any]]:
    """Every object the deployment owns; the rules as a PrometheusRule or a plain ConfigMap."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    rendered = render_all(body, spec, replicas, operator_namespace=operator_namespace)
    objects = [rendered.config_map, rendered.deployment, rendered.service,
               rendered.network_policy]
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


def object_problems(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> list[str]:
    """What the API server would refuse in the owned objects, named by the CR's field."""
    out = []
    if (problem := deployment_name_problem(str(body["metadata"]["name"]))) is not None:
        out.append(problem)
    for field, value in (("spec.resources.cpu", spec.cpu),
                         ("spec.resources.memory", spec.memory)):
        if value is not None and (problem := quantity_problem(field, value)) is not None:
            out.append(problem)
    return out


def ensure_admin_secret(kube: Kube, body: Mapping[str, Any], mint: TokenMint, *,
                        force: bool) -> Change:
    """Create the admin-token Secret unless the status records it (never read back)."""
    name = admin_secret_name(body)
    if not force and (body.get("status") or {}).get("adminTokenSecret") == name:
        return Change.UNCHANGED
    secret = render_admin_secret(body, mint.for_body(body))
    try:
        kube.create("v1", "secrets", body["metadata"]["namespace"], secret)
    except ApiError as exc:
        if exc.reason != "AlreadyExists":
            raise
        return Change.UNCHANGED  # ours from an earlier reconcile (the name has the uid)
    return Change.CREATED


def reconcile(kube: Kube, body: Mapping[str, Any], *, policy: OperatorPolicy,
              mint: TokenMint, resume: bool = False) -> Outcome:
    """Parse, check, render and apply; a refused spec touches nothing and says why.

    ``resume``: the operator (re)started; the admin-token Secret is created again in case
    it was deleted meanwhile (the operator cannot read it to tell).
    """
    try:
        spec = parse_spec(body)
    except SpecError as exc:
        return Outcome(problems=tuple(exc.problems))
    if problems := policy_problems(spec, policy):
        return Outcome(problems=tuple(problems), refusal=Refusal.NOT_ALLOWED,
                       warnings=spec.warnings)
    if problems := object_problems(body, spec):
        return Outcome(problems=tuple(problems), refusal=Refusal.OWNED_OBJECT_INVALID,
                       warnings=spec.warnings)
    monitoring = (kube.serves(MONITORING, "servicemonitors")
                  and kube.serves(MONITORING, "prometheusrules"))
    replicas = current_replicas(kube, body, spec)
    changes: dict[str, Change] = {}
    secret: str | None = None  # vLLM has no admin endpoint, hence no token
    where = ""
    try:
        if spec.backend is Backend.BUILTIN:
            secret = admin_secret_name(body)
            where = f"Secret/{secret}"
            changes[where] = ensure_admin_secret(kube, body, mint, force=resume)
        for obj in desired_objects(body, spec, replicas=replicas, monitoring=monitoring,
                                   operator_namespace=policy.operator_namespace):
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            changes[where] = ensure(kube, obj)
    except ApiError as exc:
        if exc.status not in (400, 422):
            raise  # transient (or unknown): kopf retries the handler
        # Refused as written: retrying cannot help until the spec changes.
        return Outcome(problems=(f"the API server refused {where}: {exc.message}; change "
                                 "the spec field it names",),
                       refusal=Refusal.OWNED_OBJECT_INVALID, changes=changes,
                       warnings=spec.warnings)
    unsupported = render_all(body, spec, replicas).unsupported_knobs
    return Outcome(changes=changes, unsupported_knobs=unsupported, monitoring=monitoring,
                   admin_secret=secret,
                   replicas=replicas if replicas is not None else
                   min(max(spec.min_replicas, 1), spec.max_replicas), config=spec.engine,
                   warnings=spec.warnings)


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
