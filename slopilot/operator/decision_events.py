"""The events a tick's decision posts on its LLMDeployment: one for every action, and
the twin's verdict whenever a check ran, so that ``kubectl describe`` tells what the loop
did and why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.engine.sim.correction import describe_factors
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
