"""Write an LLMDeployment's status without losing another writer's fields.

Two writers share the status: the reconcile handler and the controller daemon. A JSON
merge patch replaces a list whole, so a writer that merged its conditions into a stale
copy of ``status.conditions`` would drop the other's (the daemon's first tick used to
wipe ``Valid``, ``Reconciled`` and ``AdminToken``). Each write therefore reads the object,
builds its patch from what is there now, and sends it conditional on the
resourceVersion it read: a concurrent write makes it a 409 Conflict, and it reads and
builds again (client-go's RetryOnConflict).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slopilot.operator.crd import API_VERSION, PLURAL
from slopilot.operator.kubeapi import ApiError, Kube

log = logging.getLogger(__name__)
ATTEMPTS = 8

StatusBuilder = Callable[[dict[str, Any]], dict[str, Any] | None]
"""The fresh object in, its status patch out (None: nothing to write)."""


class StatusConflict(RuntimeError):
    """Every attempt met a concurrent write; the caller retries later."""


def write_status(kube: Kube, namespace: str, name: str, build: StatusBuilder, *,
                 attempts: int = ATTEMPTS) -> dict[str, Any] | None:
    """Patch ``status`` as ``build`` says from the object as it is now; the object after the
    write, or None when the object is gone."""
    for _ in range(attempts):
        body = kube.get(API_VERSION, PLURAL, namespace, name)
        if body is None:
            return None
        status = build(body)
        if status is None:
            return body
        patch = {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                 "status": status}
        try:
            return kube.patch(API_VERSION, PLURAL, namespace, name, patch,
                              subresource="status")
        except ApiError as exc:
            if exc.status == 404:
                return None
            if exc.status != 409:
                raise
            log.debug("%s/%s: status write met a concurrent write; again", namespace, name)
    raise StatusConflict(f"{namespace}/{name}: {attempts} status writes in a row met a "
                         "concurrent write")
