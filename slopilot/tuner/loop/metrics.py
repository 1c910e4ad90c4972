"""The controller's own Prometheus series (the dashboards query the first three).

    slopilot_tuner_trials_total{slopilot_deployment, state}          counter
    slopilot_tuner_actions_total{slopilot_deployment, action, reason} counter
    slopilot_replicas{slopilot_deployment}                            gauge
    slopilot_tuner_state{slopilot_deployment, state}                  gauge, 1 for current

``reason`` is a short token (the first word of a decision's reason), so the label's
values stay few.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge

from slopilot.tuner.loop.state import Action, ControllerState, TrialOutcome
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL

_TOKEN = re.compile(r"[a-z0-9_]+")


def reason_token(reason: str) -> str:
    match = _TOKEN.match(reason.lower())
    return match.group(0) if match else "other"


class TunerMetrics:
    """Series of every controller that shares ``registry`` (one label per deployment)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.trials = Counter("slopilot_tuner_trials", "Tuner trials by outcome.",
                              [DEPLOYMENT_LABEL, "state"], registry=self.registry)
        self.actions = Counter("slopilot_tuner_actions", "Controller actions.",
                               [DEPLOYMENT_LABEL, "action", "reason"],
                               registry=self.registry)
        self.replicas = Gauge("slopilot_replicas", "Replicas the controller asked for.",
                              [DEPLOYMENT_LABEL], registry=self.registry)
        self.state = Gauge("slopilot_tuner_state", "1 for the controller's current state.",
                           [DEPLOYMENT_LABEL, "state"], registry=self.registry)

    def trial(self, deployment: str, outcome: TrialOutcome) -> None:
        self.trials.labels(deployment, outcome.value).inc()

    def action(self, deployment: str, action: Action, reason: str) -> None:
        if action is not Action.NONE:
            self.actions.labels(deployment, action.value, reason_token(reason)).inc()

    def observe(self, deployment: str, state: ControllerState, replicas: int) -> None:
        self.replicas.labels(deployment).set(replicas)
        for s in ControllerState:
            self.state.labels(deployment, s.value).set(1 if s is state else 0)
