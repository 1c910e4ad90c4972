"""kopf settings for the slopilot operator, applied by the startup handler.

- Peering (leader election): replicas of the operator join the ClusterKopfPeering named
  ``slopilot`` (manifests/kopf-peering.yaml); only the highest-priority live peer handles
  objects, so two replicas never retune or scale the same deployment twice. ``slopilot
  operator`` passes the name to kopf (``--peering``) unless ``--standalone`` is given.
- Progress and the last handled spec live in annotations under ``slopilot.dev/``, not in
  ``status.kopf``: the status belongs to the controller and users, and annotations survive
  an operator restart, so a half-done handler resumes instead of running twice.
- Events at INFO and above reach ``kubectl describe``; DEBUG stays in the operator's log.
- Bounded watches and requests: a silent connection is dropped and resumed from its
  resourceVersion rather than hanging.
"""

from __future__ import annotations

import logging

import kopf

PREFIX = "slopilot.dev"
FINALIZER = f"{PREFIX}/finalizer"
WATCH_SERVER_TIMEOUT_S = 60
WATCH_CLIENT_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 30
PEERING_LIFETIME_S = 60
RETRY_BACKOFF_S = 10


def configure(settings: kopf.OperatorSettings) -> None:
    """Set everything but the peering name and standalone mode (the command line sets those)."""
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "slopilot-operator"
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration")
    settings.peering.lifetime = PEERING_LIFETIME_S
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.networking.request_timeout = REQUEST_TIMEOUT_S
    settings.execution.default_backoff = RETRY_BACKOFF_S
