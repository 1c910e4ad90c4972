"""Check and default objects against a CRD's openAPIV3Schema, as the apiserver does.

jsonschema's Draft 4 validator understands the OpenAPI v3 subset that structural CRD
schemas use (type, properties, required, enum, minimum, maximum, pattern, items);
the ``x-kubernetes-*`` extensions and ``default`` are not validation keywords there,
so defaulting is done here by walking the schema, before validation, like the apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonschema


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
    validator = jsonschema.Draft4Validator(top)
    out = []
    for error in sorted(validator.iter_errors(checked), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "<root>"
        out.append(f"{path}: {error.message}")
    return out
