"""Where an LLMDeployment's pods may land: ``spec.scheduling`` and the default spread.

    scheduling:
      nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
      tolerations:
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      priorityClassName: inference-high

Every pod template also carries a soft spread over nodes (``spread_constraint``): a
replica goes to the node with the fewest of this deployment's pods where the scheduler
can, so a node's drain or loss takes one replica, not all of them, and never is a pod left
Pending for it (``ScheduleAnyway``). It counts this deployment's own pods only, by the
labels its Deployment selects them with, and a spread counts pods of the pod's own
namespace only: no tenant's spread weighs, or is weighed by, another's pods.

The shapes are judged here and by the CRD (``scheduling_schema``); what a tenant may name
on a shared cluster is the administrator's (policy.py): a priority class only from the
operator's allow-list (a tenant's ``system-cluster-critical`` pod would preempt other
teams' pods, and a ``system-*`` class is never allowed), and a toleration only of a taint
key on its list (a taint is how nodes are reserved for a team). A node selector is not
policed: it only narrows where the pods may go, and reserved nodes are kept by their taints.
No affinity field: the default spread covers what it is mostly asked for, and its
free-form terms could select other tenants' pods (a namespaceSelector) for anti-affinity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.operator.crd_types import cel, integer, obj, string
from slopilot.operator.validation import DNS_1123_SUBDOMAIN

HOSTNAME = "kubernetes.io/hostname"
MAX_NODE_SELECTOR = 32
MAX_TOLERATIONS = 16
MAX_LABEL_KEY = 317  # a 253-character prefix, '/', a 63-character name
MAX_LABEL_VALUE = 63
MAX_PRIORITY_CLASS = 253
MAX_TOLERATION_S = 86400 * 7
# A label key as the API server takes it: an optional DNS-subdomain prefix and '/', then
# a name of letters, digits, '-', '_' and '.' that starts and ends with a letter or digit.
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
PRIORITY_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
OPERATORS = ("Exists", "Equal")
EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
FIELDS = ("nodeSelector", "tolerations", "priorityClassName")
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
_LABEL_KEY, _LABEL_VALUE = re.compile(LABEL_KEY_PATTERN), re.compile(LABEL_VALUE_PATTERN)

# The rules of a toleration the API server's own validation has (ValidateTolerations),
# here so that a CR is refused at apply, naming its field, not its Deployment later.
TOLERATION_RULES = (
    ("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || "
     "self.value == ''", "operator Exists takes no value: remove value, or use Equal"),
    ("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
     "a toleration without a key must be operator Exists (it then tolerates every taint)"),
    ("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
     "tolerationSeconds applies to effect NoExecute only: set that effect or remove it"),
)


@dataclass(frozen=True)
class Scheduling:
    """``spec.scheduling`` as the pod template takes it (empty: the cluster's defaults)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    priority_class_name: str | None = None


def scheduling_schema() -> dict[str, Any]:
    toleration = obj({
        "key": string("The taint key tolerated; empty (with operator Exists) tolerates "
                      "every taint. The operator's SLOPILOT_ALLOWED_TOLERATIONS names the "
                      "keys a CR may tolerate.", pattern=LABEL_KEY_PATTERN + "|^$",
                      maxLength=MAX_LABEL_KEY),
        "operator": string("Equal (the default: the taint's value must be value) or Exists.",
                           enum=list(OPERATORS)),
        "value": string("The taint value, with operator Equal.",
                        pattern=LABEL_VALUE_PATTERN, maxLength=MAX_LABEL_VALUE),
        "effect": string("The taint effect tolerated; empty: every effect.",
                         enum=list(EFFECTS)),
        "tolerationSeconds": integer("effect NoExecute: how long the pod stays on a node "
                                     "after the taint is added.", 0, MAX_TOLERATION_S),
    })
    toleration["x-kubernetes-validations"] = [{"rule": r, "message": m}
                                              for r, m in TOLERATION_RULES]
    return obj({
        "nodeSelector": {
            "type": "object", "maxProperties": MAX_NODE_SELECTOR,
            "description": "Node labels every pod's node must have (the pod's nodeSelector), "
                           "e.g. nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3.",
            "additionalProperties": string("", pattern=LABEL_VALUE_PATTERN,
                                           maxLength=MAX_LABEL_VALUE)},
        "tolerations": {
            "type": "array", "maxItems": MAX_TOLERATIONS, "items": toleration,
            "description": "Taints the pods tolerate, as a pod's tolerations; only keys "
                           "the operator's policy allows (by default nvidia.com/gpu)."},
        "priorityClassName": cel(string(
            "A PriorityClass for the pods; only one the operator's "
            "SLOPILOT_ALLOWED_PRIORITY_CLASSES allows (none by default), never system-*.",
            pattern=PRIORITY_CLASS_PATTERN, maxLength=MAX_PRIORITY_CLASS),
            "!self.startsWith('system-')",
            "system-* priority classes are the cluster's own: a tenant's pods must not "
            "preempt cluster-critical ones; use a class the administrator allows"),
    }, desc="Where the pods may run. Every pod also spreads softly over nodes "
            "(kubernetes.io/hostname, ScheduleAnyway) among this deployment's own pods.")


def spread_constraint(pods: Mapping[str, str]) -> dict[str, Any]:
    """The soft spread over nodes every pod template carries (module docstring), among
    the pods of these labels (the Deployment's selector: ``owned_meta.selector``)."""
    return {"maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": dict(pods)}}


def pod_placement(pods: Mapping[str, str], scheduling: Scheduling) -> dict[str, Any]:
    """The pod spec's placement fields for the pods of the labels ``pods``."""
    out: dict[str, Any] = {"topologySpreadConstraints": [spread_constraint(pods)]}
    if scheduling.node_selector:
        out["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        out["tolerations"] = [dict(t) for t in scheduling.tolerations]
    if scheduling.priority_class_name:
        out["priorityClassName"] = scheduling.priority_class_name
    return out


def label_key_problem(where: str, key: str) -> str | None:
    prefix, _, _name = key.rpartition("/")
    if len(key) > MAX_LABEL_KEY or not _LABEL_KEY.fullmatch(key) or len(prefix) > 253:
        return (f"{where}: {key[:80]!r} is not a label key: use an optional DNS prefix and "
                "'/', then at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit, e.g. nvidia.com/gpu.product")
    return None


def label_value_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{where}={value!r}: expected a string (quote it: '{value}')"
    if len(value) > MAX_LABEL_VALUE or not _LABEL_VALUE.fullmatch(value):
        return (f"{where}={value[:80]!r} is not a label value: at most 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit")
    return None


def _unknown(raw: Mapping[str, Any], where: str, known: tuple[str, ...],
             problems: list[str]) -> bool:
    """Whether ``raw`` has a key not in ``known`` (each named; the API server prunes them,
    so an object that came another way is refused rather than read as placing nothing)."""
    extra = sorted(str(k) for k in raw if k not in known)
    problems.extend(f"{where}.{k}: not a field of {where}; use only {', '.join(known)}"
                    for k in extra)
    return bool(extra)


def _node_selector(raw: Any, problems: list[str]) -> dict[str, str]:
    where = "spec.scheduling.nodeSelector"
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping of node label to value")
        return {}
    if len(raw) > MAX_NODE_SELECTOR:
        problems.append(f"{where}: {len(raw)} labels; use at most {MAX_NODE_SELECTOR}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        found = [p for p in (label_key_problem(where, str(key)),
                             label_value_problem(f"{where}.{key}", value)) if p]
        problems += found
        if not found:
            out[str(key)] = value
    return out


def _toleration(raw: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping with {', '.join(TOLERATION_FIELDS)}")
        return None
    if _unknown(raw, where, TOLERATION_FIELDS, problems):
        return None
    before = len(problems)
    key, operator = raw.get("key", ""), raw.get("operator", "Equal")
    value, effect = raw.get("value", ""), raw.get("effect", "")
    seconds = raw.get("tolerationSeconds")
    if not isinstance(key, str):
        problems.append(f"{where}.key={key!r}: expected a string")
    elif key and (problem := label_key_problem(f"{where}.key", key)):
        problems.append(problem)
    elif not key and operator != "Exists":
        problems.append(f"{where}.key: required with operator {operator!r}: name the taint "
                        "key (or use operator Exists to tolerate every taint)")
    if operator not in OPERATORS:
        problems.append(f"{where}.operator={operator!r} is not allowed; use one of: "
                        f"{', '.join(OPERATORS)}")
    if operator == "Exists" and value:
        problems.append(f"{where}.value={value!r}: operator Exists takes no value: remove "
                        "it, or use operator Equal")
    elif value and (problem := label_value_problem(f"{where}.value", value)):
        problems.append(problem)
    if effect not in EFFECTS:
        problems.append(f"{where}.effect={effect!r} is not allowed; use one of: "
                        f"{', '.join(e for e in EFFECTS if e)} (or leave it out for all)")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, int) \
                or not 0 <= seconds <= MAX_TOLERATION_S:
            problems.append(f"{where}.tolerationSeconds={seconds!r}: use whole seconds, "
                            f"0 to {MAX_TOLERATION_S}")
        elif effect != "NoExecute":
            problems.append(f"{where}.tolerationSeconds={seconds}: applies to effect "
                            "NoExecute only: set that effect or remove it")
    if len(problems) > before:
        return None
    return {k: raw[k] for k in TOLERATION_FIELDS if k in raw}


def parse_scheduling(spec: Mapping[str, Any], problems: list[str]) -> Scheduling:
    """``spec.scheduling``, its shapes judged (the policy judges what it may name)."""
    raw = spec.get("scheduling")
    if raw is None:
        return Scheduling()
    where = "spec.scheduling"
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: expected a mapping with {', '.join(FIELDS)}")
        return Scheduling()
    if _unknown(raw, where, FIELDS, problems):
        return Scheduling()
    node_selector = _node_selector(raw.get("nodeSelector"), problems)
    tolerations: list[dict[str, Any]] = []
    given = raw.get("tolerations")
    if given is not None and not isinstance(given, list):
        problems.append(f"{where}.tolerations: expected a list of tolerations, e.g. "
                        "[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]")
    elif given is not None:
        if len(given) > MAX_TOLERATIONS:
            problems.append(f"{where}.tolerations: {len(given)} given; use at most "
                            f"{MAX_TOLERATIONS}")
        for i, item in enumerate(given):
            if (toleration := _toleration(item, f"{where}.tolerations[{i}]",
                                          problems)) is not None:
                tolerations.append(toleration)
    priority = raw.get("priorityClassName")
    if priority is not None and (not isinstance(priority, str) or not priority
                                 or len(priority) > MAX_PRIORITY_CLASS
                                 or not DNS_1123_SUBDOMAIN.fullmatch(priority)):
        problems.append(f"{where}.priorityClassName={str(priority)[:80]!r} is not a "
                        "PriorityClass name (lowercase letters, digits, '-' and '.'); name "
                        "one the cluster's administrator allows, or leave it out")
        priority = None
    return Scheduling(node_selector=node_selector, tolerations=tuple(tolerations),
                      priority_class_name=priority)
