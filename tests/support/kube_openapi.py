"""What the emulator serves to kubectl: OpenAPI documents and server-side tables.

- ``/openapi/v3`` lists one document per group-version; each holds the CRDs' schemas
  (tagged with ``x-kubernetes-group-version-kind``, as ``kubectl explain`` looks them up)
  and, for every resource, the paths with the ``fieldValidation`` query parameter, which
  tells kubectl the server validates fields itself (it then sends
  ``fieldValidation=Strict`` instead of validating on the client).
- ``/openapi/v2``: kubectl downloads it before validating; an empty document (protobuf,
  as it asks) says there is nothing to check on the client.
- ``table(...)``: a ``meta.k8s.io/v1`` Table, as the apiserver builds one for
  ``kubectl get``: a Name column, then a CRD's ``additionalPrinterColumns`` evaluated
  by their JSON paths (dates as ages), or Age for other resources.
- ``strict_problems``: the unknown fields a ``fieldValidation=Strict`` write would be
  refused for.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes_validate
from kmock import ResourceInfo, resource

from tests.support.crd_schema import prune

KUBE_VERSION = "1.33.0"
NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
               "description": "Name must be unique within a namespace."}
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def gv_path(res: resource) -> str:
    return f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"


def _params(namespaced: bool, named: bool) -> list[dict[str, Any]]:
    out = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"},
            "description": "Ignore, Warn or Strict: what to do with unknown fields."},
           {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
           {"name": "dryRun", "in": "query", "schema": {"type": "string"}}]
    if namespaced:
        out.append({"name": "namespace", "in": "path", "required": True,
                    "schema": {"type": "string"}})
    if named:
        out.append({"name": "name", "in": "path", "required": True,
                    "schema": {"type": "string"}})
    return out


def schema_name(group: str, version: str, kind: str) -> str:
    reverse = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
    return f"{reverse}.{version}.{kind}"


def v3_document(resources: Mapping[resource, ResourceInfo],
                schemas: Mapping[resource, Mapping[str, Any]], gv: str) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version (``apis/apps/v1``, ``api/v1``)."""
    paths: dict[str, Any] = {}
    components: dict[str, Any] = {}
    for res, info in resources.items():
        if gv_path(res) != gv or not res.plural or "/" in str(res.plural):
            continue
        gvk = {"group": res.group or "", "version": res.version, "kind": info.kind}
        namespaced = info.namespaced is not False
        base = f"/{gv}/" + ("namespaces/{namespace}/" if namespaced else "") + str(res.plural)
        ops = {verb: {"operationId": f"{verb}{info.kind}", "x-kubernetes-action": action,
                      "x-kubernetes-group-version-kind": gvk, "responses": {"200": {}}}
               for verb, action in (("get", "get"), ("put", "put"), ("patch", "patch"),
                                    ("delete", "delete"))}
        paths[base + "/{name}"] = {**ops, "parameters": _params(namespaced, True)}
        paths[base] = {"get": {**ops["get"], "x-kubernetes-action": "list"},
                       "post": {**ops["get"], "operationId": f"create{info.kind}",
                                "x-kubernetes-action": "post"},
                       "parameters": _params(namespaced, False)}
        if res in schemas:
            schema = json.loads(json.dumps(schemas[res]))
            schema["x-kubernetes-group-version-kind"] = [gvk]
            props = schema.setdefault("properties", {})
            props["metadata"] = {"description": "Standard object's metadata.",
                                 "allOf": [{"$ref": "#/components/schemas/"
                                            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]}
            components[schema_name(res.group, res.version, info.kind)] = schema
    components["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"] = {
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object", "properties": {
            "name": {"type": "string", "description": "Name must be unique within a "
                     "namespace."},
            "namespace": {"type": "string", "description": "Namespace defines the space "
                          "within which each name must be unique."},
            "labels": {"type": "object", "additionalProperties": {"type": "string"},
                       "description": "Map of string keys and values."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Unstructured key value map."}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths, "components": {"schemas": components}}


def v3_root(resources: Iterable[resource]) -> dict[str, Any]:
    gvs = sorted({gv_path(r) for r in resources if r.plural})
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash="
                           + hashlib.sha256(gv.encode()).hexdigest()[:16].upper()}
                      for gv in gvs}}


def v2_document() -> dict[str, Any]:
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": {}, "definitions": {}}


def _lookup(body: Any, json_path: str) -> Any:
    """A printer column's simple JSON path (``.status.config.tokenBudget``)."""
    node = body
    for part in json_path.strip().lstrip(".").split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _age(stamp: Any) -> str | None:
    if not isinstance(stamp, str):
        return None
    then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def table(bodies: Iterable[Mapping[str, Any]], columns: list[Mapping[str, Any]] | None,
          resource_version: str) -> dict[str, Any]:
    """The Table ``kubectl get`` asks for (``Accept: ...;as=Table;g=meta.k8s.io``)."""
    columns = list(columns) if columns else [AGE_COLUMN]
    definitions = [NAME_COLUMN] + [
        {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
         "description": c.get("description", ""), "priority": c.get("priority", 0)}
        for c in columns]
    rows = []
    for body in bodies:
        cells: list[Any] = [body["metadata"]["name"]]
        for c in columns:
            value = _lookup(body, c["jsonPath"])
            cells.append(_age(value) if c.get("type") == "date" else value)
        meta = {k: body["metadata"][k] for k in ("name", "namespace", "uid",
                                                 "resourceVersion", "creationTimestamp",
                                                 "labels") if k in body["metadata"]}
        rows.append({"cells": cells, "object": {
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": definitions, "rows": rows}


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in str(accept)


def strict_problems(body: Mapping[str, Any], schema: Mapping[str, Any] | None) -> list[str]:
    """Unknown fields, as ``fieldValidation=Strict`` refuses them (custom objects by their
    CRD's schema, built-in kinds by Kubernetes' own)."""
    if schema is not None:
        return [f'unknown field "{path}"' for path in _dropped(body, prune(schema, body))]
    try:
        kubernetes_validate.validate(dict(body), KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{path}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError):
        return []
    return []


def _dropped(before: Any, after: Any, path: str = "") -> list[str]:
    if not isinstance(before, Mapping):
        return []
    out = []
    for key, value in before.items():
        here = f"{path}.{key}" if path else str(key)
        if not isinstance(after, Mapping) or key not in after:
            out.append(here)
        else:
            out += _dropped(value, after[key], here)
    return out
