"""Pure helpers for the Kubernetes emulator: API errors, server-side metadata, selectors.

Kept apart from the HTTP plumbing in ``kube_emulator`` so that each rule the real
apiserver enforces (what a create fills in, what an update may not touch, when the
generation moves) reads as one small function.
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

import jsonpatch
from kmock import KubernetesError, ResourceInfo, resource
from kmock._internal import dicts  # kmock's merge-patch helper (None deletes a key)

# Fields of metadata that only the server sets; a client's values are ignored on update.
SERVER_METADATA = ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                   "name", "namespace")


def api_error(status: int, reason: str, message: str, *,
              res: resource | None = None, kind: str | None = None,
              name: str | None = None,
              causes: list[dict[str, str]] | None = None) -> KubernetesError:
    """A Status body as the apiserver sends it (the official client keys on ``reason``)."""
    details: dict[str, Any] = {}
    if causes:
        details["causes"] = causes
    if name is not None:
        details["name"] = name
    if res is not None:
        details["group"] = res.group
    if kind is not None:
        details["kind"] = kind
    return KubernetesError(status=status, reason=reason, message=message, details=details)


def qualified(res: resource) -> str:
    """``deployments.apps`` or ``pods``: how the apiserver names a resource in messages."""
    return f"{res.plural}.{res.group}" if res.group else str(res.plural)


def not_found(res: resource, name: str, kind: str | None = None) -> KubernetesError:
    return api_error(404, "NotFound", f'{qualified(res)} "{name}" not found',
                     res=res, kind=kind or res.plural, name=name)


def already_exists(res: resource, name: str, kind: str | None = None) -> KubernetesError:
    return api_error(409, "AlreadyExists", f'{qualified(res)} "{name}" already exists',
                     res=res, kind=kind or res.plural, name=name)


def conflict(res: resource, name: str) -> KubernetesError:
    return api_error(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified(res)} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        res=res, name=name)


def precondition_failed(res: resource, namespace: str | None, name: str, what: str,
                        wanted: Any, found: Any) -> KubernetesError:
    """409 Conflict for a DELETE whose ``preconditions`` (``what``: ``UID`` or
    ``ResourceVersion``) the object no longer meets, worded as the API server's storage
    error is (storage.Preconditions.Check, then InterpretDeleteError)."""
    key = "/".join(p for p in ("/registry", res.group, str(res.plural), namespace, name) if p)
    return api_error(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified(res)} "{name}": StorageError: invalid '
        f"object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: Precondition "
        f"failed: {what} in precondition: {wanted}, {what} in object meta: {found}",
        res=res, name=name)


def invalid(res: resource, name: str | None, *problems: str,
            kind: str | None = None) -> KubernetesError:
    """422 Invalid with one cause per problem (``field: message``), as kubectl prints them."""
    causes = []
    for problem in problems:
        field, sep, message = problem.partition(": ")
        causes.append({"reason": "FieldValueInvalid", "message": message if sep else problem,
                       "field": field if sep else ""})
    why = "; ".join(problems) if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return api_error(422, "Invalid", f'{kind or qualified(res)} "{name or ""}" is invalid: '
                     f"{why}", res=res, name=name, kind=kind, causes=causes)


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_version_of(res: resource) -> str:
    return f"{res.group}/{res.version}" if res.group else str(res.version)


def kind_of(res: resource, info: ResourceInfo | None) -> str:
    if info is not None and info.kind:
        return info.kind
    plural = str(res.plural)
    return plural[:-1].capitalize() if plural.endswith("s") else plural.capitalize()


def apply_patch(current: Mapping[str, Any], patch: Any, content_type: str,
                res: resource, name: str) -> dict[str, Any]:
    """Merge, strategic-merge (treated as merge) or JSON patch; bad patches are 422s."""
    if "json-patch" in content_type or isinstance(patch, list):
        try:
            result = jsonpatch.apply_patch(copy.deepcopy(dict(current)), patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise invalid(res, name, f"the JSON patch cannot be applied: {exc}") from None
        return dict(result)
    if not isinstance(patch, Mapping):
        raise api_error(400, "BadRequest", "the patch body must be a JSON object or list")
    return dict(dicts.patch_dict(copy.deepcopy(dict(current)), patch))


def carry_server_fields(old: Mapping[str, Any], new: dict[str, Any], *,
                        status_subresource: bool, to_status: bool) -> dict[str, Any]:
    """What an update may change: spec+metadata on the main resource, status on /status."""
    if to_status:
        merged = copy.deepcopy(dict(old))
        if "status" in new:
            merged["status"] = new["status"]
        else:
            merged.pop("status", None)
        return merged
    if status_subresource:
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    meta = new.setdefault("metadata", {})
    for key in SERVER_METADATA:
        if key in old.get("metadata", {}):
            meta[key] = old["metadata"][key]
        else:
            meta.pop(key, None)
    new["apiVersion"] = old.get("apiVersion", new.get("apiVersion"))
    new["kind"] = old.get("kind", new.get("kind"))
    return new


def bump_generation(old: Mapping[str, Any], new: dict[str, Any]) -> None:
    """The generation moves when anything but metadata and status changes (the spec)."""
    def desired(body: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("metadata", "status")}
    if desired(old) != desired(new):
        new["metadata"]["generation"] = int(old.get("metadata", {}).get("generation", 1)) + 1


# --- label selectors (equality- and set-based, as `kubectl -l` accepts) -----------------

_SET_EXPR = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    """Split on commas that are not inside ``in (a,b)`` parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def matches_labels(labels: Mapping[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in _split_selector(selector):
        if m := _SET_EXPR.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(body: Mapping[str, Any], selector: str | None) -> bool:
    """Only the fields every resource supports: metadata.name and metadata.namespace."""
    if not selector:
        return True
    meta = body.get("metadata", {})
    for term in _split_selector(selector):
        negate = "!=" in term
        key, value = (s.strip() for s in re.split(r"!=|==|=", term, maxsplit=1))
        actual = meta.get(key.removeprefix("metadata.")) if key.startswith("metadata.") else None
        if (actual == value) == negate:
            return False
    return True


def orphaned(body: Mapping[str, Any], gone_uid: str, live_uids: Iterable[str]) -> bool:
    """True when ``body`` was owned by ``gone_uid`` and no other owner of it is alive."""
    owners = {ref.get("uid") for ref in body.get("metadata", {}).get("ownerReferences", [])}
    return gone_uid in owners and not owners & set(live_uids)
