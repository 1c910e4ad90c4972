"""A minimal kopf operator for proving the emulator: it answers each LLMDeployment.

On create it writes ``status.phase`` and ``status.config`` through the status subresource
and posts an event; on delete (through kopf's finalizer) it does nothing but lets go.
Run it with ``kopf run --standalone`` against the emulator's kubeconfig.
"""

from __future__ import annotations

from typing import Any

import kopf

GROUP, VERSION, PLURAL = "slopilot.dev", "v1alpha1", "llmdeployments"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.watching.server_timeout = 10  # watches reconnect from their resourceVersion
    settings.persistence.finalizer = "slopilot.dev/test-finalizer"


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(spec: kopf.Spec, patch: kopf.Patch, body: kopf.Body, **_: Any) -> None:
    budget = spec.get("engine", {}).get("tokenBudget", 1024)
    patch.status["phase"] = "Running"
    patch.status["config"] = {"tokenBudget": budget}
    kopf.info(body, reason="Rendered", message=f"token budget {budget}")


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(**_: Any) -> None:
    """Present so that kopf holds a finalizer and the deletion path is exercised."""
