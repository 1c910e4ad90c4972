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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.operator.owned_meta import object_meta, selector


def render_pod_disruption_budget(body: Mapping[str, Any]) -> dict[str, Any]:
    name = body["metadata"]["name"]
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": object_meta(body, name),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}
