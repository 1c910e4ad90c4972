"""The PodDisruptionBudget every LLMDeployment owns: a node drain takes its pods one at a time.

Without one, ``kubectl drain`` (a node upgrade, the autoscaler's scale-down) evicts every
replica on the node at once, and an engine's pod comes back only after it has loaded its
model again (vLLM's cache is an emptyDir): minutes with no replica serving.

``maxUnavailable: 1``, not ``minAvailable: 1``: at one replica the budget allows that
pod's eviction (the drain goes on, the deployment is briefly down, as it would be
anyway), where ``minAvailable: 1`` would block the drain for good. At more replicas the
evictions wait for each replacement to be Ready before the next. Rendered at every
replica count, 1 included: the operator deletes none of its objects (the garbage collector
does, with the CR), so one that came and went with ``replicas.max`` would be left behind
when max fell to 1, and at one replica this budget blocks nothing anyway.

``unhealthyPodEvictionPolicy: AlwaysAllow``: a pod that is not Ready (crash-looping, or
still loading its model) serves nothing, so evicting it costs no capacity; under the
default (``IfHealthyBudget``) two broken replicas of three would hold the drain of their
nodes until someone fixed the tenant's deployment.

It selects the pods as their Deployment does (``owned_meta.selector``), so it counts
this deployment's pods only; a budget reaches pods of its own namespace alone.

A budget of the CR's name that is another's (a tenant's, made before the operator
rendered budgets) is left alone, and the ``DisruptionBudget`` condition says so
(``budget_conditions``: written by the spec's reconcile and by every drift repair). The
operator does not watch budgets it does not own (its watch selects its managed label,
handlers.watch_only_managed), so it learns of that one's deletion by looking: the
``foreign-budget`` timer (``FOREIGN_BUDGET_S``) on the CRs whose condition says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.operator.conditions import ConditionType, condition
from slopilot.operator.owned_meta import object_meta, selector

FOREIGN_BUDGET = "ForeignBudget"
"""The DisruptionBudget condition's reason and the event's: a budget of the CR's name
is another's, and was left as it is (reconcile.LEFT_ALONE_KINDS)."""
FOREIGN_BUDGET_S = 60.0
"""How often the operator looks whether another's budget of a CR's name is gone (then it
makes its own): a drain in that minute meets no budget of the deployment's at all."""


def render_pod_disruption_budget(body: Mapping[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": object_meta(body, name),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def budget_conditions(left_alone: tuple[str, ...], generation: int | None
                      ) -> tuple[list[dict[str, Any]], list[ConditionType]]:
    """The DisruptionBudget condition as a reconcile that left ``left_alone`` found it:
    (conditions to write, types to remove)."""
    if left_alone:
        return [condition(ConditionType.DISRUPTION_BUDGET, False, FOREIGN_BUDGET,
                          "; ".join(left_alone), generation)], []
    return [], [ConditionType.DISRUPTION_BUDGET]


def budget_is_anothers(status: Mapping[str, Any]) -> bool:
    """Whether ``status`` says the CR's budget is another's (``FOREIGN_BUDGET``)."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.DISRUPTION_BUDGET:
            return c.get("status") == "False" and c.get("reason") == FOREIGN_BUDGET
    return False
