"""Where the Deployment's rollout stands, read from its status as ``kubectl rollout
status`` reads it: the loop's ``DeploymentHandle.settled`` on vLLM, whose configs are
new pods with new arguments.

Settled only when the Deployment controller has seen the current template
(``observedGeneration``), every asked replica is of it (``updatedReplicas``) and
available, and no pod of an older template is left (``status.replicas`` counts them).
Stuck once the controller marks the rollout past its ``progressDeadlineSeconds``
(``Progressing`` False, ``ProgressDeadlineExceeded``): a surge pod that never schedules
(a quota without a spare pod's GPUs), a model that never loads; and while it is paused
(``kubectl rollout pause``), which no deadline ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.tuner.loop.ports import Pending, Rollout, Settled, Stuck

DEADLINE_REASON = "ProgressDeadlineExceeded"


def rollout_of(dep: Mapping[str, Any]) -> Rollout:
    """``dep``'s rollout (see the module docstring). Its conditions are read only once
    the controller has seen the current template, as kubectl reads them: a deadline the
    previous rollout passed is not this one's."""
    status = dep.get("status") or {}
    spec = dep.get("spec") or {}
    name = (dep.get("metadata") or {}).get("name") or "NAME"
    if spec.get("paused"):
        # The controller makes no new pods for a paused Deployment and checks no deadline
        # on it: waited for, it was Pending at every tick, the trial or cooldown for ever.
        return Stuck(f"the Deployment is paused (spec.paused): no replica gets the new "
                     f"template until `kubectl rollout resume deployment/{name}`")
    generation = int((dep.get("metadata") or {}).get("generation") or 0)
    observed = status.get("observedGeneration")
    want = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    total = int(status.get("replicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    # Any move of the controller's: the loop's own bound counts from the last one.
    progress = f"generation {generation}/{observed}: {updated} updated, {total} in all, " \
        f"{available} available"
    if observed is None or int(observed) < generation:
        return Pending(f"the Deployment controller has not seen generation {generation} "
                       f"yet (observed {observed})", progress)
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Progressing" \
                and c.get("reason") == DEADLINE_REASON:
            return Stuck(f"{DEADLINE_REASON}: {c.get('message') or 'no message'}")
    if updated < want:
        return Pending(f"{updated} of {want} replicas updated", progress)
    if total > updated:
        return Pending(f"{total - updated} old replica(s) still running", progress)
    if available < updated:
        return Pending(f"{available} of {updated} updated replicas available", progress)
    return Settled()
