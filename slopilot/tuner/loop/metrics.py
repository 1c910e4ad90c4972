"""The controller's own Prometheus series (the dashboards query the first three).

    slopilot_tuner_trials_total{slopilot_namespace, slopilot_deployment, state}   counter
    slopilot_tuner_actions_total{slopilot_namespace, slopilot_deployment, action, reason}
    slopilot_replicas{slopilot_namespace, slopilot_deployment}                    gauge
    slopilot_tuner_state{slopilot_namespace, slopilot_deployment, state}          gauge
    slopilot_twin_error{..., quantity, priority_class}   gauge: the last twin check's
        relative errors, (predicted - measured) / measured: quantity step_time (the profile
        as given), step_time_corrected, ttft_p99 and tbt_p99 (per class)
    slopilot_twin_trusted{slopilot_namespace, slopilot_deployment}                gauge
    slopilot_twin_correction_factor{..., feature}        gauge: what the last check's
        correction learned, per cost-model feature (absent while the twin runs uncorrected)

Series are keyed by namespace and name, as the rules are: one operator runs the
controllers of ``chat`` in ``team-a`` and in ``team-b`` side by side. (``namespace`` itself
is taken: Prometheus puts the operator pod's namespace there.) ``reason`` is a word of a
closed vocabulary (``reasons.py``): the first word of a decision's reason where it is one
the controller writes with that action, else "other" (``reason_token``). So one
deployment's counter carries at most ``len(reasons.LABEL_PAIRS)`` series, whatever the
texts, and the operator's page is sized from that (docs/operations.md, "Scrape limits").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.samples import Sample

from slopilot.tuner.loop.decision import Action, TrialOutcome
from slopilot.tuner.loop.reasons import reason_token
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.loop.twin_check import TwinCheck
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, NAMESPACE_LABEL


class _Counter(Counter):
    """A Counter without its ``_created`` sample. One operator serves every tuned
    deployment's series from one page, and the page's samples are what its scrape limit
    is sized from (docs/operations.md, "Scrape limits"): a ``_created`` per counter
    series doubled the counters, and no rule, dashboard or read uses it.
    prometheus_client's own switch (``disable_created_metrics``) is process-wide: it
    would change the engine's exposition too where both run in one process."""

    def _child_samples(self) -> Iterable[Sample]:
        return [s for s in super()._child_samples() if s.name != "_created"]


class TunerMetrics:
    """Series of every controller that shares ``registry`` (one label set per deployment).

    A controller records under its deployment's name and this object's ``namespace``
    ("" outside Kubernetes); ``in_namespace`` gives a view on the same series for another.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 namespace: str = "") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace = namespace
        self._labels: list[tuple[Counter | Gauge, list[str]]] = []
        """Every series and its label names, in order (what ``forget`` removes)."""

        def series(kind: type[Counter] | type[Gauge], name: str, doc: str,
                   *labels: str) -> Any:
            names = [NAMESPACE_LABEL, DEPLOYMENT_LABEL, *labels]
            metric = kind(name, doc, names, registry=self.registry)
            self._labels.append((metric, names))
            return metric

        self.trials: Counter = series(_Counter, "slopilot_tuner_trials",
                                      "Tuner trials by outcome.", "state")
        self.actions: Counter = series(_Counter, "slopilot_tuner_actions",
                                       "Controller actions.", "action", "reason")
        self.replicas: Gauge = series(Gauge, "slopilot_replicas",
                                      "Replicas the controller asked for.")
        self.state: Gauge = series(Gauge, "slopilot_tuner_state",
                                   "1 for the controller's current state.", "state")
        self.twin_error: Gauge = series(
            Gauge, "slopilot_twin_error", "The twin's relative error on the last checked "
            "window, (predicted - measured) / measured.", "quantity", "priority_class")
        self.twin_trusted: Gauge = series(
            Gauge, "slopilot_twin_trusted", "1 while the controller trusts its twin's warm "
            "starts and capacity plans.")
        self.twin_factor: Gauge = series(
            Gauge, "slopilot_twin_correction_factor", "What the last twin check's "
            "correction learned: the factor on each cost-model feature's coefficient.",
            "feature")
        self.clock_offset: Gauge = series(
            Gauge, "slopilot_prometheus_clock_offset_seconds", "The operator's clock less "
            "Prometheus's, as last read: windows are read on Prometheus's clock, but the "
            "times the operator writes (status, events) are off by this much.")
        self.status_write_failures: Counter = series(
            _Counter, "slopilot_status_write_failures", "Writes of the controller's "
            "status the API server failed: until one is taken the loop does not tick.")
        # Features each deployment's gauge holds, so a check that learned fewer (or none)
        # drops the rest instead of leaving an old correction on the dashboard.
        self._factor_features: dict[tuple[str, str], set[str]] = {}

    def in_namespace(self, namespace: str) -> TunerMetrics:
        """The same series, recorded for deployments of ``namespace``."""
        view = copy.copy(self)
        view.namespace = namespace
        return view

    def forget(self, deployment: str) -> None:
        """Remove every series of ``deployment`` (in this view's namespace): it is gone,
        or no longer tuned, and one operator's /metrics must not keep every deleted
        tenant's deployment forever."""
        key = (self.namespace, deployment)
        for metric, names in self._labels:
            seen = {tuple(s.labels[n] for n in names) for family in metric.collect()
                    for s in family.samples if all(n in s.labels for n in names)}
            for values in seen:
                if values[:2] == key:
                    metric.remove(*values)
        self._factor_features.pop(key, None)

    def trial(self, deployment: str, outcome: TrialOutcome) -> None:
        self.trials.labels(self.namespace, deployment, outcome.value).inc()

    def status_write_failed(self, deployment: str) -> None:
        self.status_write_failures.labels(self.namespace, deployment).inc()

    def action(self, deployment: str, action: Action, reason: str) -> None:
        if action is not Action.NONE:
            self.actions.labels(self.namespace, deployment, action.value,
                                reason_token(reason, action)).inc()

    def observe(self, deployment: str, state: ControllerState, replicas: int) -> None:
        self.replicas.labels(self.namespace, deployment).set(replicas)
        for s in ControllerState:
            self.state.labels(self.namespace, deployment, s.value).set(1 if s is state else 0)

    def clock(self, deployment: str, offset_s: float) -> None:
        self.clock_offset.labels(self.namespace, deployment).set(offset_s)

    def twin(self, deployment: str, check: TwinCheck) -> None:
        key = (self.namespace, deployment)
        self.twin_trusted.labels(*key).set(1 if check.trusted else 0)
        rows = [("step_time", "", check.step_error),
                ("step_time_corrected", "", check.corrected_error)]
        for c in check.classes:
            rows += [("ttft_p99", c.priority, c.ttft_error), ("tbt_p99", c.priority,
                                                               c.tbt_error)]
        for quantity, cls, value in rows:
            if value is not None:
                self.twin_error.labels(*key, quantity, cls).set(value)
        for gone in self._factor_features.get(key, set()) - set(check.factors):
            self.twin_factor.remove(*key, gone)
        for feature, factor in check.factors.items():
            self.twin_factor.labels(*key, feature).set(factor)
        self._factor_features[key] = set(check.factors)
