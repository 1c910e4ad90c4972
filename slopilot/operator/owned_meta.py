"""What every object an LLMDeployment owns carries: its labels and its controller reference.

Each renderer stamps the same metadata, so that the Service's and the ServiceMonitor's
selectors find the Deployment's pods, the drift check finds the operator's own objects
(``MANAGED``), and the reference makes each the CR's (``ownership.py`` reads it back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.operator.crd import API_VERSION, KIND


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference every owned object carries (kopf's, as ``kopf.adopt`` sets
    it). kopf.adopt itself is not used: it would also copy the CR's labels, which tenants
    edit without a spec change, onto the children."""
    return dict(kopf.build_owner_reference(cast("kopf.Body", {
        **body, "apiVersion": API_VERSION, "kind": KIND}), controller=True,
        block_owner_deletion=True))


MANAGED = {"app.kubernetes.io/managed-by": "slopilot-operator"}  # on every owned object


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "slopilot-engine", "app.kubernetes.io/instance": name,
            **MANAGED, "slopilot.dev/llmdeployment": name}


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": name, "slopilot.dev/llmdeployment": name}


def object_meta(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"name": name, "namespace": body["metadata"]["namespace"],
            "labels": labels(body["metadata"]["name"]),
            "ownerReferences": [owner_reference(body)]}
