"""Bring the objects an LLMDeployment owns in line with its spec: create, or patch on a difference.

Idempotent by construction: each desired object is compared with the live one and patched
only where the live object does not already carry every desired field (the apiserver adds
defaults, so "covers" is a subset test, not equality), or carries a field the operator
owns and no longer renders (owned_fields.py: sent as a null). A second reconcile of an
unchanged spec therefore sends no writes at all.

Two things the controller owns survive a reconcile: the Deployment's replica count (kept
within the spec's range) and a committed tuned configuration (``status.tunedConfig``),
which ``parse_spec`` lays over the spec's knobs while the spec's engine section is the one
it was tuned from.

A spec is refused, touching nothing, when it fails ``parse_spec`` (InvalidSpec), the
administrator's policy (NotAllowed), or would render objects the API server refuses
(OwnedObjectInvalid: checked first and named by the CR's field; an API refusal that
slipped past the checks is reported the same way rather than retried every 10 s), or
when an object of a name it would take exists and is not this CR's (NameTaken): the
operator changes only what this CR controls, by the uid in the controller reference, so
a tenant cannot name an LLMDeployment after another team's Deployment or the namespace's
NetworkPolicy and have it rewritten (and garbage-collected with the CR). A taken name is
looked at again every ``RETRY_NAME_TAKEN_S``; so is an object another controller took
(its controller reference another's, the CR's a plain owner), which is not fought over.

Owner references other writers added to an owned object are kept (ownership.py): its
``ownerReferences`` are written only to put the CR's own reference right, whole and on
condition of the version read; where the API server refuses that (403: changing the
list needs ``delete`` on the object under OwnerReferencesPermissionEnforcement), the
rest of the object is still repaired and ``Outcome.not_restored`` says which and why.

A PodDisruptionBudget of the CR's name that is not its own is no reason to refuse the
CR (``LEFT_ALONE_KINDS``): a tenant may well have made one for its pods before the
operator rendered budgets, and a refusal left a new CR without its Deployment and failed
every trial of an existing one. It is left as it is, no budget of the operator's is
made, and ``Outcome.left_alone`` says so (the ``DisruptionBudget`` condition): two
budgets over the same pods make the eviction API refuse their evictions, so the tenant
is told to delete theirs.

The engines' admin token is in no object at all: the Deployment's pod template carries
only its digest (tokens.py), rendered like any other field.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.operator.conditions import DriftReason
from slopilot.operator.crd import KIND
from slopilot.operator.images import SHIPPED_IMAGES, Images
from slopilot.operator.knobs import KNOB_PATHS, VLLM_APPLIES
from slopilot.operator.kubeapi import ApiError, Kube
from slopilot.operator.network_peers import DEFAULT_PROMETHEUS_PEERS, Peer
from slopilot.operator.owned_fields import (
    removals,
    whole_differs,
    with_removals,
    without_unknown,
)
from slopilot.operator.owned_meta import labels, owner_reference
from slopilot.operator.ownership import (
    claims,
    controller_ref,
    names_owner,
    other_controller,
    refs_to_write,
)
from slopilot.operator.policy import OperatorPolicy, policy_problems, trial_ceiling_warning
from slopilot.operator.quantity import same_quantity
from slopilot.operator.render import render_all
from slopilot.operator.service_monitor import latency_sources
from slopilot.operator.spec import Backend, LLMDeploymentSpec, SpecError, parse_spec
from slopilot.operator.tokens import TokenMint
from slopilot.operator.validation import deployment_name_problem, quantity_problem
from slopilot.operator.vllm_take_back import rendered_body
from slopilot.tuner.prometheus.alert_table import AlertAdvice
from slopilot.tuner.prometheus.rules import render_prometheus_rule, render_rules_yaml

MONITORING = "monitoring.coreos.com/v1"
RULES_FILE = "slopilot-rules.yaml"
PLURALS = {("v1", "ConfigMap"): "configmaps", ("v1", "Service"): "services",
           ("apps/v1", "Deployment"): "deployments",
           ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
           ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
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
    NAME_TAKEN = "NameTaken"  # Reconciled=False: an object of an owned name is another's

    @property
    def of_objects(self) -> bool:
        """The spec is fine; the objects it asks for cannot be made (Reconciled=False)."""
        return self in (Refusal.OWNED_OBJECT_INVALID, Refusal.NAME_TAKEN)


RETRY_NAME_TAKEN_S = 60.0
"""How soon a reconcile refused for a taken name looks again: the object may be deleted
(by its owner, or by the garbage collector once an earlier CR of this name is gone), and
no event of an object the operator does not manage reaches it."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconcile found and did; ``problems`` is non-empty for an invalid spec."""

    problems: tuple[str, ...] = ()
    refusal: Refusal = Refusal.INVALID_SPEC
    """Why, when ``problems`` is not empty."""
    changes: Mapping[str, Change] = dataclasses.field(default_factory=dict)  # "Kind/name"
    unsupported_knobs: tuple[str, ...] = ()
    monitoring: bool = False
    admin_token: bool = False
    """The pods admit the operator's admin token (builtin only: vLLM has no admin API)."""
    replicas: int | None = None
    config: EngineConfig | None = None  # the knobs rendered (spec plus committed tuning)
    warnings: tuple[str, ...] = ()
    """The parsed spec's warnings (a deprecated field): posted, never refused."""
    retry_s: float | None = None
    """Reconcile again after this long even without a change (a taken name may clear)."""
    not_restored: tuple[str, ...] = ()
    """Objects whose own owner reference the API server would not let the operator put
    right (the rest of each was repaired), said why: ``Reconciled=False`` while so."""
    left_alone: tuple[str, ...] = ()
    """Objects of an owned name that are another's and were left as they are rather than
    refused for (``LEFT_ALONE_KINDS``), each said with its fix."""

    @property
    def valid(self) -> bool:
        return not self.problems


def plural_of(obj: Mapping[str, Any]) -> str:
    return PLURALS[(obj["apiVersion"], obj["kind"])]


def covers(live: Any, desired: Any) -> bool:
    """Whether ``live`` already carries every field of ``desired`` (lists element-wise;
    a container's resource amounts by amount, ``_covers_resources``)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and (_covers_resources(live[k], v) if k == "resources"
                           else covers(live[k], v)) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(covers(a, b) for a, b in zip(live, desired, strict=True)))
    return bool(live == desired)


def _covers_resources(live: Any, desired: Any) -> bool:
    """A container's (or pod's) ``resources``: the API server serves each request and
    limit back in its canonical form ("1" for 1, "500m" for "0.5"), so they are compared
    as quantities; compared as written, a GPU deployment was patched at every reconcile."""
    if not isinstance(desired, Mapping) or not isinstance(live, Mapping):
        return covers(live, desired)
    for part, amounts in desired.items():
        if part not in live:
            return False
        if part in ("requests", "limits") and isinstance(amounts, Mapping):
            have = live[part]
            if not isinstance(have, Mapping) or not all(
                    k in have and same_quantity(have[k], v) for k, v in amounts.items()):
                return False
        elif not covers(live[part], amounts):
            return False
    return True



def _owned_meta(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": body["metadata"]["namespace"],
            "labels": labels(body["metadata"]["name"]),
            "ownerReferences": [owner_reference(body)]}


def desired_objects(body: Mapping[str, Any], spec: LLMDeploymentSpec, *,
                    replicas: int | None, monitoring: bool,
                    operator_namespace: str, namespace_label: str | None = None,
                    admin_token_sha256: str | None = None,
                    images: Images = SHIPPED_IMAGES,
                    dcgm_namespace: str | None = None,
                    http_peers: Sequence[Peer] = DEFAULT_PROMETHEUS_PEERS
                    ) -> list[dict[str, Any]]:
    """Every object the deployment owns; the rules as a PrometheusRule or a plain ConfigMap.
    ``admin_token_sha256``, ``images``: what the pods admit and run (``render_deployment``).
    ``dcgm_namespace``: where the DCGM exporter runs (``OperatorPolicy.dcgm_namespace``).
    ``http_peers``: who outside the namespace reaches the engines (``render_network_policy``)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    rendered = render_all(body, spec, replicas, operator_namespace=operator_namespace,
                          admin_token_sha256=admin_token_sha256, images=images,
                          http_peers=http_peers)
    objects = [rendered.config_map, rendered.deployment, rendered.service,
               rendered.network_policy, rendered.pod_disruption_budget]
    latency = latency_sources(spec.backend)
    # Tuning off: no controller reads the alerts, so none may say it acts (a spec edit
    # turning it on reconciles, and renders the acting rows again).
    advice = AlertAdvice(tuning=spec.tuning.enabled,
                         applied_knobs=VLLM_APPLIES if spec.backend is Backend.VLLM else None)
    if monitoring:
        rule = render_prometheus_rule(spec.slo, name, namespace, options=spec.alerts,
                                      dcgm_namespace=dcgm_namespace,
                                      namespace_label=namespace_label, latency=latency,
                                      advice=advice)
        rule["metadata"] = {**_owned_meta(body, rule["metadata"]["name"]),
                            "labels": {**rule["metadata"]["labels"], **labels(name)}}
        objects += [rendered.service_monitor, rule]
    else:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": _owned_meta(body, f"{name}-rules"),
                        "data": {RULES_FILE: render_rules_yaml(
                            spec.slo, name, namespace=namespace, options=spec.alerts,
                            dcgm_namespace=dcgm_namespace,
                            namespace_label=namespace_label, latency=latency,
                            advice=advice)}})
    return objects


def owned_names(name: str) -> frozenset[tuple[str, str]]:
    """Every (kind, name) ``desired_objects`` renders for an LLMDeployment of ``name``,
    with monitoring and without, whatever its spec: the objects whose events are its
    drift. Any other object, whatever its labels and owner reference say, is none of
    its objects, and its events reach no reconcile."""
    return frozenset({("ConfigMap", f"{name}-engine"), ("Deployment", name),
                      ("Service", name), ("NetworkPolicy", name),
                      ("PodDisruptionBudget", name), ("ServiceMonitor", name),
                      ("PrometheusRule", f"slopilot-{name}"), ("ConfigMap", f"{name}-rules")})


LEFT_ALONE_KINDS = frozenset({"PodDisruptionBudget"})
"""Kinds whose object of the CR's name, when another's, the CR does without rather than
being refused for: its pods run and are tuned as well without the operator's budget."""


def left_alone_message(kind: str, name: str) -> str:
    return (f"{kind}/{name} already exists and is not managed by this LLMDeployment: the "
            "operator leaves it as it is and makes no budget of its own. A second budget "
            "selecting the same pods makes the eviction API refuse their evictions (a "
            "node drain stops), so add none; delete this one for the operator to make "
            "its own (maxUnavailable 1) at its next reconcile, or let it be this "
            "deployment's budget")


class NameTaken(Exception):
    """An object of a name the CR's objects take exists and is not the CR's."""


class WriteFailed(ApiError):
    """A write of an owned object failed in a way a retry may clear (not a 400 or 422):
    ``what`` names the object ("Kind/name"), for a condition that says which."""

    def __init__(self, what: str, exc: ApiError) -> None:
        super().__init__(exc.status, exc.reason, exc.message)
        self.what = what


def taken(kind: str, live: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    """Why ``live`` (a ``kind``) is not ``body``'s to change; None when the CR claims it,
    by uid (``ownership.claims``)."""
    uid = str(body["metadata"].get("uid") or "")
    if claims(live, KIND, uid):
        return None
    name = (live.get("metadata") or {}).get("name")
    if names_owner(live, KIND, uid) and (other := other_controller(live, uid)) is not None:
        # It was this CR's, or is shared with it, and another controller has taken it:
        # neither fought over (each rewriting the other's reference) nor rewritten.
        return (f"{kind}/{name} names this LLMDeployment as an owner, but "
                f"{other.get('kind')}/{other.get('name')} (uid {other.get('uid')}) is its "
                "controller: the operator does not take an object from another "
                "controller; remove that controller reference (or set its controller to "
                "false) for the operator to manage the object again, or delete the object "
                f"for the operator to make it again; it looks again every "
                f"{RETRY_NAME_TAKEN_S:g} s")
    ref = controller_ref(live)
    if ref is None:
        owner = "it has no controller"
    elif ref.get("kind") == KIND and ref.get("name") == body["metadata"]["name"]:
        owner = (f"an earlier LLMDeployment {ref.get('name')} (uid {ref.get('uid')}) "
                 "controls it; the garbage collector removes it once that one is gone")
    else:
        owner = f"{ref.get('kind')}/{ref.get('name')} controls it"
    return (f"{kind}/{name} already exists and is not managed by this LLMDeployment "
            f"({owner}): use another name for the LLMDeployment, or remove that object; "
            f"the operator looks again every {RETRY_NAME_TAKEN_S:g} s")


def live_object(kube: Kube, desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The object of ``desired``'s kind and name as it is now (None: there is none)."""
    meta = desired["metadata"]
    return kube.get(desired["apiVersion"], plural_of(desired), meta["namespace"],
                    meta["name"])


class RefsRefused(ApiError):
    """The API server refused the operator's own owner reference put right (403: the
    OwnerReferencesPermissionEnforcement plugin wants ``delete`` on the object to change
    its ownerReferences); ``change`` is what the rest of the object's repair did."""

    def __init__(self, exc: ApiError, change: Change) -> None:
        super().__init__(exc.status, exc.reason, exc.message)
        self.change = change


def _patch(kube: Kube, desired: Mapping[str, Any], body: Mapping[str, Any],
           patch: Mapping[str, Any]) -> None:
    """Send ``patch``; a 409 from an object that is no longer the CR's is NameTaken."""
    api, plural, meta = desired["apiVersion"], plural_of(desired), desired["metadata"]
    try:
        kube.patch(api, plural, meta["namespace"], meta["name"], patch)
    except ApiError as exc:
        if exc.status != 409:
            raise
        now = kube.get(api, plural, meta["namespace"], meta["name"])
        if now is not None and (why := taken(desired["kind"], now, body)) is not None:
            raise NameTaken(why) from None
        raise  # changed, and the CR's still (or gone): kopf runs the reconcile again


def ensure(kube: Kube, desired: Mapping[str, Any], body: Mapping[str, Any],
           live: Mapping[str, Any] | None) -> Change:
    """Create the object, or patch it where ``live`` (``live_object``'s answer) differs;
    nothing is sent when it matches. Raises NameTaken when an object of that name is
    there and is not ``body``'s, RefsRefused when the CR's own owner reference on it
    could not be put right (the rest of it was).

    Owner references other writers added are kept (ownership.py): the rendered list (the
    CR's reference alone) is no part of the comparison or of the patch, and the whole
    list goes only where the CR's own reference is missing or wrong."""
    api, plural = desired["apiVersion"], plural_of(desired)
    meta = desired["metadata"]
    if live is None:
        try:
            kube.create(api, plural, meta["namespace"], desired)
            return Change.CREATED
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
            live = kube.get(api, plural, meta["namespace"], meta["name"]) or {}
    if (why := taken(desired["kind"], live, body)) is not None:
        raise NameTaken(why)
    # A field the operator owns but no longer renders is drift too, sent as a null: a
    # merge patch keeps what it does not name (owned_fields.py).
    nulls = removals(desired, live)
    [ours] = meta["ownerReferences"]
    refs = refs_to_write(live, ours)
    rest = {**desired, "metadata": {k: v for k, v in meta.items() if k != "ownerReferences"}}
    drifted = (bool(nulls) or not covers(live, without_unknown(rest, live))
               or whole_differs(desired, live))
    if refs is None and not drifted:
        return Change.UNCHANGED
    patch = with_removals(copy.deepcopy(
        {k: v for k, v in rest.items() if k not in ("apiVersion", "kind")}), nulls)
    # The uid judged above is a precondition (409 for another object): by name alone, an
    # object deleted and made again under the name by another owner since the read was
    # patched into this CR's, its owner reference included.
    live_meta = live.get("metadata") or {}
    if uid := live_meta.get("uid"):
        patch["metadata"]["uid"] = uid
    if refs is None:
        _patch(kube, desired, body, patch)
        return Change.PATCHED
    # A merge patch replaces the list whole: sent on condition of the version read, so
    # that a reference another writer added since is not dropped (409: looked at again).
    with_refs = copy.deepcopy(patch)
    with_refs["metadata"]["ownerReferences"] = refs
    if version := live_meta.get("resourceVersion"):
        with_refs["metadata"]["resourceVersion"] = version
    try:
        _patch(kube, desired, body, with_refs)
    except ApiError as exc:
        if exc.status != 403:
            raise
        # Not let change the list: the rest is still repaired, and the list is reported,
        # not tried again in the same patch at every event (which would repair nothing).
        if drifted:
            _patch(kube, desired, body, patch)
        raise RefsRefused(exc, Change.PATCHED if drifted else Change.UNCHANGED) from None
    return Change.PATCHED


def current_replicas(kube: Kube, body: Mapping[str, Any], spec: LLMDeploymentSpec) -> int | None:
    """The live replica count clamped into the spec's range; None before the first create."""
    live = kube.get("apps/v1", "deployments", body["metadata"]["namespace"],
                    body["metadata"]["name"])
    if live is None or not claims(live, KIND, str(body["metadata"].get("uid") or "")):
        return None  # none yet, or another's (which the reconcile refuses to touch)
    count = int((live.get("spec") or {}).get("replicas", 1))
    return min(max(count, spec.min_replicas), spec.max_replicas)


def object_problems(body: Mapping[str, Any], spec: LLMDeploymentSpec) -> list[str]:
    """What the API server would refuse in the owned objects, named by the CR's field."""
    out = []
    if (problem := deployment_name_problem(str(body["metadata"]["name"]))) is not None:
        out.append(problem)
    for field, value in (("spec.resources.cpu", spec.cpu),
                         ("spec.resources.memory", spec.memory),
                         ("spec.resources.ephemeralStorage", spec.ephemeral_storage)):
        if value is not None and (problem := quantity_problem(field, value)) is not None:
            out.append(problem)
    return out


def not_reconciled(kube: Kube, body: Mapping[str, Any], spec: LLMDeploymentSpec
                   ) -> str | None:
    """Why this CR's objects are not its own to act on (None: they are, or not made yet).

    The tuning controller scales the Deployment of the CR's name: it runs only while the
    reconcile accepts the objects (``object_problems``, the last ``Reconciled`` condition
    of this generation) and that Deployment, where it exists, is the CR's by uid.
    """
    if problems := object_problems(body, spec):
        return "the reconcile refuses this LLMDeployment's objects: " + "; ".join(problems)
    generation = body["metadata"].get("generation")
    for c in (body.get("status") or {}).get("conditions") or ():
        # A drift repair's False is no refusal of the spec: an object is missing, wrong
        # or its name taken a while, and tried again (a Deployment that is not the CR's
        # is caught below, by uid).
        if c.get("type") == "Reconciled" and c.get("status") == "False" \
                and c.get("reason") != DriftReason.NOT_REPAIRED \
                and c.get("observedGeneration") == generation:
            return ("the reconcile refuses this LLMDeployment's objects: "
                    f"{c.get('reason')}: {c.get('message')}")
    meta = body["metadata"]
    live = kube.get("apps/v1", "deployments", meta["namespace"], meta["name"])
    return None if live is None else taken("Deployment", live, body)


def reconcile(kube: Kube, body: Mapping[str, Any], *, policy: OperatorPolicy,
              mint: TokenMint, defer_unanswered: bool = False) -> Outcome:
    """Parse, check, render and apply; a refused spec touches nothing and says why.
    With ``defer_unanswered`` (kopf's handlers), RenderDeferred with nothing applied
    where what to render waits on the study's answer (vllm_take_back.rendered_body)."""
    # A trial's record the operator took off a vLLM Deployment, and could not replace
    # (the status took no write), is not rendered again (vllm_take_back.py).
    body = rendered_body(kube, body, mint, policy, defer_unanswered=defer_unanswered)
    try:
        spec = parse_spec(body)
    except SpecError as exc:
        return Outcome(problems=tuple(exc.problems))
    if problems := policy_problems(spec, policy, namespace=body["metadata"]["namespace"]):
        return Outcome(problems=tuple(problems), refusal=Refusal.NOT_ALLOWED,
                       warnings=spec.warnings)
    if (capped := trial_ceiling_warning(spec, policy)) is not None:
        # Said where the spec's own warnings are (the SpecWarning event, the Valid
        # condition's message): a bound the administrator applies to what it asked.
        spec = dataclasses.replace(spec, warnings=(*spec.warnings, capped))
    if problems := object_problems(body, spec):
        return Outcome(problems=tuple(problems), refusal=Refusal.OWNED_OBJECT_INVALID,
                       warnings=spec.warnings)
    monitoring = (kube.serves(MONITORING, "servicemonitors")
                  and kube.serves(MONITORING, "prometheusrules"))
    replicas = current_replicas(kube, body, spec)
    objects = desired_objects(body, spec, replicas=replicas, monitoring=monitoring,
                              operator_namespace=policy.operator_namespace,
                              namespace_label=policy.namespace_label,
                              admin_token_sha256=mint.sha256_for_body(body),
                              images=policy.images, dcgm_namespace=policy.dcgm_namespace,
                              http_peers=(*policy.prometheus_peers,
                                          *policy.engine_ingress_peers))
    lives = [live_object(kube, obj) for obj in objects]
    objects, lives, left_alone = _without_left_alone(objects, lives, body)
    # Every name is judged before anything is written, so that a refusal touches nothing.
    if problems := name_problems(objects, lives, body):
        return _name_taken(problems, spec.warnings)
    changes: dict[str, Change] = {}
    not_restored: list[str] = []
    where = ""
    try:
        for obj, live in zip(objects, lives, strict=True):
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            try:
                changes[where] = ensure(kube, obj, body, live)
            except RefsRefused as exc:  # the others are still put right
                changes[where] = exc.change
                not_restored.append(refs_refused_message(where, exc))
            except NameTaken:
                if obj["kind"] not in LEFT_ALONE_KINDS:
                    raise
                # Made by another since the look above: left as it is too.
                left_alone.append(left_alone_message(obj["kind"], obj["metadata"]["name"]))
    except NameTaken as exc:  # made by someone else since the check above
        return _name_taken([str(exc)], spec.warnings, changes)
    except ApiError as exc:
        if exc.status not in (400, 422):
            # Transient (or unknown): kopf retries the handler.
            raise WriteFailed(where, exc) from exc
        # Refused as written: retrying cannot help until the spec changes.
        return Outcome(problems=(f"the API server refused {where}: {exc.message}; change "
                                 "the spec field it names",),
                       refusal=Refusal.OWNED_OBJECT_INVALID, changes=changes,
                       warnings=spec.warnings)
    unsupported = render_all(body, spec, replicas).unsupported_knobs
    return Outcome(changes=changes, unsupported_knobs=unsupported, monitoring=monitoring,
                   admin_token=spec.backend is Backend.BUILTIN,
                   replicas=replicas if replicas is not None else
                   min(max(spec.min_replicas, 1), spec.max_replicas), config=spec.engine,
                   warnings=spec.warnings, not_restored=tuple(not_restored),
                   left_alone=tuple(left_alone))


def refs_refused_message(where: str, exc: ApiError) -> str:
    return (f"{where}: its owner reference to this LLMDeployment is missing its controller "
            "mark (controller and blockOwnerDeletion true) or names the CR wrongly, and "
            f"the API server refused to put it right ({exc.status} {exc.reason}: "
            f"{exc.message}): where the OwnerReferencesPermissionEnforcement admission "
            "plugin runs, changing an object's ownerReferences needs delete on it, which "
            "the operator is not granted; set that reference right by hand, or delete the "
            "object for the operator to make it again (the rest of the object was "
            "repaired)")


def name_problems(objects: list[dict[str, Any]], lives: list[dict[str, Any] | None],
                  body: Mapping[str, Any]) -> list[str]:
    """Of ``objects`` (as they are now: ``lives``), those that exist and are not
    ``body``'s, said why."""
    return [why for obj, live in zip(objects, lives, strict=True)
            if live is not None and (why := taken(obj["kind"], live, body)) is not None]


def _without_left_alone(objects: list[dict[str, Any]], lives: list[dict[str, Any] | None],
                        body: Mapping[str, Any]
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None], list[str]]:
    """``objects`` and ``lives`` less those of ``LEFT_ALONE_KINDS`` that are another's,
    and what is said of each of those."""
    kept: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    said: list[str] = []
    for obj, live in zip(objects, lives, strict=True):
        if obj["kind"] in LEFT_ALONE_KINDS and live is not None \
                and taken(obj["kind"], live, body) is not None:
            said.append(left_alone_message(obj["kind"], obj["metadata"]["name"]))
        else:
            kept.append((obj, live))
    return [o for o, _ in kept], [li for _, li in kept], said


def _name_taken(problems: list[str], warnings: tuple[str, ...],
                changes: Mapping[str, Change] | None = None) -> Outcome:
    return Outcome(problems=tuple(problems), refusal=Refusal.NAME_TAKEN,
                   changes=dict(changes or {}), warnings=warnings,
                   retry_s=RETRY_NAME_TAKEN_S)


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
