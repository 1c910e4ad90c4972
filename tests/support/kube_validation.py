"""What the real API server refuses in the objects this project writes: names, labels,
owner references, replica counts, resource quantities, a ConfigMap's size and a
PodDisruptionBudget's one bound, with the apiserver's own wording.

The emulator calls ``object_problems`` on every create and every non-status update, so
a test sees the 422 a cluster would send (and the operator has to cope with it), not a
create that succeeds only because the emulator was lenient. Then ``store_quantities``
puts each container's resource amounts in the form the API server stores and serves
(``1`` -> ``"1"``, ``"0.5"`` -> ``"500m"``): kept as sent, a client that compares what it
wrote with what it reads back passed here and patched at every reconcile on a cluster.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from slopilot.operator.quantity import canonical

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
INT32_MAX = 2**31 - 1
MAX_CONFIGMAP_BYTES = 1024 * 1024
"""core.MaxSecretSize: what ValidateConfigMap allows a ConfigMap's values, all together."""

# Resources whose names are DNS-1035 labels (a Service's name is a DNS name and an env
# variable prefix) or DNS-1123 labels; everything else is a DNS-1123 subdomain.
DNS_1035_NAMED = {"services"}
DNS_1123_LABEL_NAMED = {"namespaces"}


def _dns_1035(value: str) -> str:
    return (f'Invalid value: "{value}": a DNS-1035 label must consist of lower case '
            "alphanumeric characters or '-', start with an alphabetic character, and end "
            "with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
            "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")


def _dns_1123_label(value: str) -> str:
    return (f'Invalid value: "{value}": a lowercase RFC 1123 label must consist of lower '
            "case alphanumeric characters or '-', and must start and end with an "
            "alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def _dns_1123_subdomain(value: str) -> str:
    return (f'Invalid value: "{value}": a lowercase RFC 1123 subdomain must consist of lower '
            "case alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character (e.g. 'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def name_problem(plural: str, name: str) -> str | None:
    """``metadata.name: ...`` as the apiserver words it, or None for a valid name."""
    if plural in DNS_1035_NAMED:
        if len(name) > 63:
            return f'metadata.name: Invalid value: "{name}": must be no more than 63 characters'
        return None if DNS_1035.match(name) else f"metadata.name: {_dns_1035(name)}"
    if plural in DNS_1123_LABEL_NAMED:
        if len(name) > 63:
            return f'metadata.name: Invalid value: "{name}": must be no more than 63 characters'
        return None if DNS_1123_LABEL.match(name) else f"metadata.name: {_dns_1123_label(name)}"
    if len(name) > 253:
        return f'metadata.name: Invalid value: "{name}": must be no more than 253 characters'
    return None if DNS_1123_SUBDOMAIN.match(name) else \
        f"metadata.name: {_dns_1123_subdomain(name)}"


def label_problems(where: str, labels: Mapping[str, Any]) -> list[str]:
    out = []
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS_1123_SUBDOMAIN.match(prefix))) \
                or not name or len(name) > 63 or not LABEL_NAME.match(name):
            out.append(f'{where}: Invalid value: "{key}": name part must consist of '
                       "alphanumeric characters, '-', '_' or '.', and must start and end "
                       "with an alphanumeric character")
        if not isinstance(value, str):
            out.append(f"{where}: Invalid value: {value!r}: label values must be strings")
        elif len(value) > 63:
            out.append(f'{where}: Invalid value: "{value}": must be no more than 63 '
                       "characters")
        elif not LABEL_VALUE.match(value):
            out.append(f'{where}: Invalid value: "{value}": a valid label must be an empty '
                       "string or consist of alphanumeric characters, '-', '_' or '.', and "
                       "must start and end with an alphanumeric character")
    return out


def owner_reference_problems(refs: Any) -> list[str]:
    """ValidateOwnerReferences' rule that matters to controllers: one controller at most."""
    controllers = [f"{r.get('kind')}/{r.get('name')}" for r in refs or ()
                   if isinstance(r, Mapping) and r.get("controller") is True]
    if len(controllers) < 2:
        return []
    return [f"metadata.ownerReferences: Invalid value: {len(refs)} references: Only one "
            f'reference can have Controller set to true. Found "true" in references for '
            f"{controllers[0]} and {controllers[1]}"]


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, int, Any]]:
    return [(field, i, c) for field in ("initContainers", "containers")
            for i, c in enumerate(pod.get(field) or ())]


def _pod_spec_problems(where: str, spec: Mapping[str, Any]) -> list[str]:
    out = []
    for field, i, container in _containers(spec):
        for kind in ("limits", "requests"):
            for resource, amount in ((container.get("resources") or {}).get(kind)
                                     or {}).items():
                path = f"{where}.{field}[{i}].resources.{kind}[{resource}]"
                if isinstance(amount, bool) or not (
                        isinstance(amount, int) or QUANTITY.match(str(amount))):
                    out.append(f"{path}: Invalid value: {amount!r}: quantities must match "
                               "the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*"
                               "[-+]?[0-9]*)$'")
    return out


POD_TEMPLATED = ("deployments", "replicasets", "statefulsets", "daemonsets", "jobs")


def store_quantities(plural: str, body: dict[str, Any]) -> None:
    """Each container's requests and limits as resource.Quantity serializes them (the
    canonical form, always a string), in place; run after ``object_problems``."""
    spec = body.get("spec") or {}
    if plural in POD_TEMPLATED:
        pod = (spec.get("template") or {}).get("spec") or {}
    elif plural == "pods":
        pod = spec
    else:
        return
    for _, _, c in _containers(pod):
        for kind in ("limits", "requests"):
            amounts = (c.get("resources") or {}).get(kind) or {}
            for resource, amount in amounts.items():
                amounts[resource] = canonical(amount)


def configmap_size(body: Mapping[str, Any]) -> int:
    """The bytes ValidateConfigMap counts: each ``data`` value's (UTF-8, as Go's len of a
    string) and each ``binaryData`` value's decoded; not the keys."""
    size = sum(len(v.encode()) for v in (body.get("data") or {}).values()
               if isinstance(v, str))
    for value in (body.get("binaryData") or {}).values():
        try:
            size += len(base64.b64decode(str(value), validate=True))
        except (binascii.Error, ValueError):  # not this module's to word; counted as sent
            size += len(str(value))
    return size


def object_problems(plural: str, body: Mapping[str, Any]) -> list[str]:
    """Everything the apiserver's validation of ``body`` would refuse (the subset here)."""
    meta = body.get("metadata") or {}
    out = []
    if isinstance(meta.get("name"), str) and (problem := name_problem(plural, meta["name"])):
        out.append(problem)
    out += label_problems("metadata.labels", meta.get("labels") or {})
    out += owner_reference_problems(meta.get("ownerReferences"))
    spec = body.get("spec") or {}
    if plural in ("deployments", "replicasets", "statefulsets"):
        replicas = spec.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) \
                or not 0 <= replicas <= INT32_MAX:
            out.append(f"spec.replicas: Invalid value: {replicas!r}: must be a 32-bit integer "
                       "greater than or equal to 0")
        template = spec.get("template") or {}
        out += label_problems("spec.template.metadata.labels",
                              (template.get("metadata") or {}).get("labels") or {})
        out += _pod_spec_problems("spec.template.spec", template.get("spec") or {})
    if plural == "pods":
        out += _pod_spec_problems("spec", spec)
    if plural == "poddisruptionbudgets" and spec.get("minAvailable") is not None \
            and spec.get("maxUnavailable") is not None:
        # ValidatePodDisruptionBudgetSpec: field.Invalid on the spec itself
        out.append("spec: Invalid value: minAvailable and maxUnavailable cannot be both set")
    if plural == "configmaps" and configmap_size(body) > MAX_CONFIGMAP_BYTES:
        # field.TooLong on the root path, which the API server prints as "[]"
        out.append(f"[]: Too long: may not be more than {MAX_CONFIGMAP_BYTES} bytes")
    return out
