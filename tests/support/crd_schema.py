"""Prune, default and check objects against a CRD's openAPIV3Schema, as the apiserver does.

In the apiserver's order: unknown fields are pruned (except under
``x-kubernetes-preserve-unknown-fields``), defaults filled in, then the object is
validated: jsonschema's Draft 4 validator understands the OpenAPI v3 subset that
structural CRD schemas use (type, properties, required, enum, minimum, maximum, pattern,
items, anyOf; ``nullable`` read as a null admitted), and the ``x-kubernetes-validations``
CEL rules run on cel-python, each with ``self`` bound to its node, as the apiserver binds
it. A list of ``x-kubernetes-list-type: map`` holds no two items of the same
``x-kubernetes-list-map-keys`` (``list_map_errors``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import celpy
import jsonschema

OBJECT_META = {"name", "generateName", "namespace", "uid", "resourceVersion", "generation",
               "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
               "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
               "selfLink"}


def served_schema(crd: Mapping[str, Any], version: str | None = None) -> dict[str, Any]:
    """The openAPIV3Schema of ``version`` (default: the storage version) of a CRD."""
    versions = crd["spec"]["versions"]
    for item in versions:
        if (version is None and item.get("storage")) or item["name"] == version:
            return dict(item["schema"]["openAPIV3Schema"])
    raise KeyError(f"CRD {crd['metadata']['name']} serves no version {version!r}")


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of ``value`` with the schema's defaults filled in where fields are absent."""
    value = copy.deepcopy(value)
    _fill(schema, value)
    return value


def _fill(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _fill(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name in value:
                if name not in schema.get("properties", {}):
                    _fill(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _fill(schema["items"], item)


def schema_errors(schema: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """Every violation as ``path: message`` (empty when the body is valid)."""
    checked = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
    top = {**schema, "properties": {
        k: v for k, v in schema.get("properties", {}).items()
        if k not in ("apiVersion", "kind", "metadata")}}
    validator = jsonschema.Draft4Validator(_nullable(top))
    out = []
    for error in sorted(validator.iter_errors(checked), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "<root>"
        out.append(f"{path}: {error.message}")
    return out


def _nullable(schema: Any) -> Any:
    """``schema`` with OpenAPI's ``nullable: true`` as Draft 4 says it (a null admitted),
    which the apiserver honours and jsonschema's Draft 4 validator ignores."""
    if isinstance(schema, list):
        return [_nullable(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: _nullable(v) for k, v in schema.items()}
    if out.get("nullable") is not True:
        return out
    del out["nullable"]
    if not isinstance(out.get("type"), str):
        return {"anyOf": [out, {"type": "null"}]}
    # A type list, not anyOf: a wrong value inside is named by its own path, as the
    # apiserver names it, not as "not valid under any of the given schemas" here.
    out["type"] = [out["type"], "null"]
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def prune(schema: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``body`` without the fields the schema does not know (metadata: ObjectMeta)."""
    out = copy.deepcopy(dict(body))
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for key in [k for k in meta if k not in OBJECT_META]:
            del meta[key]
    for key in [k for k in out if k not in ("apiVersion", "kind", "metadata")]:
        sub = schema.get("properties", {}).get(key)
        if sub is None:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                del out[key]
        else:
            _prune(sub, out[key])
    return out


def _prune(schema: Mapping[str, Any], value: Any) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key in list(value):
            if props is not None and key in props:
                _prune(props[key], value[key])
            elif isinstance(extra, Mapping):
                _prune(extra, value[key])
            elif props is not None or extra is None:
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _prune(schema["items"], item)


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _nodes(schema: Mapping[str, Any], value: Any, path: str
           ) -> Iterator[tuple[Mapping[str, Any], Any, str]]:
    yield schema, value, path
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from _nodes(sub, value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            yield from _nodes(schema["items"], item, f"{path}[{i}]")


def cel_errors(schema: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """The ``x-kubernetes-validations`` rules ``body`` breaks, as ``path: message``."""
    out = []
    for node, value, path in _nodes(schema, body, ""):
        for rule in node.get("x-kubernetes-validations") or ():
            try:
                ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
            except celpy.CELEvalError as exc:
                out.append(f"{path or '<root>'}: Invalid value: the rule {rule['rule']!r} "
                           f"could not be evaluated: {exc.args[0] if exc.args else exc}")
                continue
            if isinstance(ok, celpy.CELEvalError):
                out.append(f"{path or '<root>'}: Invalid value: the rule {rule['rule']!r} "
                           f"could not be evaluated: {ok.args[0] if ok.args else ok}")
            elif not bool(ok):
                message = rule.get("message") or f"failed rule: {rule['rule']}"
                out.append(f"{path or '<root>'}: Invalid value: \"object\": {message}")
    return out


def list_map_errors(schema: Mapping[str, Any], body: Mapping[str, Any]) -> list[str]:
    """Items of an ``x-kubernetes-list-type: map`` list that repeat an earlier item's
    ``x-kubernetes-list-map-keys``, as ``path[i]: Duplicate value: ...``."""
    out = []
    for node, value, path in _nodes(schema, body, ""):
        if node.get("x-kubernetes-list-type") != "map" or not isinstance(value, list):
            continue
        names = node.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            key = repr({n: item.get(n) for n in names})
            if key in seen:
                out.append(f"{path}[{i}]: Duplicate value: {key}")
            seen.add(key)
    return out
