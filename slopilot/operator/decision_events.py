"""The events a tick's decision posts on its LLMDeployment: one for every action, and
the twin's verdict whenever a check ran, so that ``kubectl describe`` tells what the loop
did and why; and the Warning of a status that takes no write, whose decision is held
(``post_status_unwritable``).

Each is posted explicitly (``kopf.info``, ``kopf.warn``): kopf posts a logger's lines as
events only when told to (``settings.posting.loggers``), which the operator is not
(settings.py), so a warning logged on the CR's logger is in the operator's log alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.engine.sim.correction import describe_factors
from slopilot.operator.crd import API_VERSION, KIND
from slopilot.tuner.loop.decision import Action, Decision


def post_decision(body: Mapping[str, Any], decision: Decision) -> None:
    target = cast("kopf.Body", body)
    twin = decision.twin
    if twin is not None:  # a check ran this tick: its verdict is an event of its own
        learned = twin.get("correctionFactors") or {}
        also = f"; learned {describe_factors(learned)}" if learned else ""
        message = (f"twin {'trusted' if twin['trusted'] else 'untrusted'}: "
                   f"{twin['reason']} (correction {twin['correction']}{also})")
        if twin["trusted"]:
            kopf.info(target, reason="TwinChecked", message=message)
        else:
            kopf.warn(target, reason="TwinUntrusted", message=message)
    if decision.action is Action.NONE:
        return
    reason = decision.action.value.capitalize()
    if decision.action in (Action.REVERT, Action.HOLD):
        kopf.warn(target, reason=reason, message=decision.reason)
    else:
        kopf.info(target, reason=reason, message=decision.line())


STATUS_UNWRITABLE = "StatusUnwritable"
"""The reason of the Warning events of a status that takes no write."""


def post_status_unwritable(namespace: str, name: str, uid: str, message: str) -> None:
    """A Warning event on LLMDeployment ``namespace/name`` (by ``uid``: never on a new
    one of the name) that its status takes no write (deployment_loop.py). The events API
    is another than the status, which an admission webhook on ``llmdeployments/status``
    that fails every PATCH leaves open."""
    ref = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"namespace": namespace, "name": name, "uid": uid}}
    kopf.warn(cast("kopf.Body", ref), reason=STATUS_UNWRITABLE, message=message)
