"""The OpenAPI v3 schema pieces the CRD is built from (``crd.py``, ``crd_status.py``)."""

from __future__ import annotations

from typing import Any

# resource.Quantity, as controller-gen writes it for Kubernetes' own types.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
MAX_QUANTITY_TEXT = 64


def obj(props: dict[str, Any], *, required: list[str] | None = None,
        desc: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object"}
    if desc:
        out["description"] = desc
    out["properties"] = props
    if required:
        out["required"] = required
    out.update(extra)
    return out


def cel(schema: dict[str, Any], rule: str, message: str) -> dict[str, Any]:
    """Attach a CEL rule the apiserver checks (cross-field rules)."""
    return {**schema, "x-kubernetes-validations": [{"rule": rule, "message": message}]}


def integer(desc: str, lo: int | None = None, hi: int | None = None,
            **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer", "description": desc}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return {**out, **extra}


def string(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def quantity(desc: str) -> dict[str, Any]:
    """An int-or-string resource quantity of 0 or more (``4``, ``'500m'``, ``'16Gi'``): a
    negative request or limit is refused in the Deployment, after the ConfigMap."""
    return {"description": desc, "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN, "x-kubernetes-int-or-string": True,
            # Bounds what the API server prices the rule below at (a string's operations
            # cost by its longest length); "1536Mi" is six characters.
            "maxLength": MAX_QUANTITY_TEXT,
            "x-kubernetes-validations": [{
                "rule": "type(self) == string ? !self.startsWith('-') || "
                        "self.matches('^-[0.]*([^0-9.].*)?$') : self >= 0",
                "message": "must not be negative: a request or limit is an amount of 0 "
                           "or more"}]}


def number(desc: str, lo: float, hi: float | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "number", "description": desc, "minimum": lo}
    if hi is not None:
        out["maximum"] = hi
    return {**out, **extra}
