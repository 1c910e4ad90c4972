"""Firing alerts of one deployment: read from Prometheus, or evaluated on window summaries.

The rules (``rules.py``) label every alert with ``action`` (what the controller should
do) and the identity labels ``slopilot_namespace`` and ``slopilot_deployment`` (whose it
is). ``AlertSource`` asks Prometheus for one deployment's firing alerts only
(``alerts_query``: its ``ALERTS`` series, selected by those labels in Prometheus), and
``parse_alert_series`` turns the answer into typed ``Alert`` objects (matched again by
namespace and name: any server may answer the tenant's URL). Where no Prometheus runs,
``SummaryAlerts`` evaluates the same alert table on window summaries with Prometheus'
``for`` semantics (see ``alert_table``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.prometheus.alert_table import (
    ALL_CLASSES,
    VALUE_FIGURE,
    AlertAction,
    AlertName,
    AlertRule,
    Figure,
    Severity,
    alert_table,
)
from slopilot.tuner.prometheus.bounded import (
    ALERTS_ANSWER_BYTES,
    ANSWER_DEADLINE_S,
    Charge,
    bounded_client,
)
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.rules import RuleOptions, identity_labels, render_selector
from slopilot.tuner.prometheus.tls import VERIFIED, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable

__all__ = ["Alert", "AlertAction", "AlertSource", "PrometheusUnavailable", "SummaryAlerts",
           "alerts_query", "parse_alert_series", "summary_figure"]


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    action: AlertAction
    severity: str
    priority_class: str
    since: float
    """Unix time the condition became active (Prometheus' activeAt)."""
    value: float | None = None
    evaluated_ago_s: float = 0.0
    """How long before it was read the rule was last evaluated, on the evaluator's own
    clock (Prometheus': the query's time less the ``ALERTS`` sample's): the alert is that
    evaluation's verdict, over the window that ended then. 0 where the answer does not
    say (read as evaluated when asked, as before this was known)."""

    def describe(self) -> str:
        return f"{self.name}[{self.priority_class},{self.severity}]"


def _value(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


_NAMES = frozenset(AlertName)
_SEVERITIES = frozenset(Severity)
_CLASSES = frozenset({ALL_CLASSES, *(p.label for p in Priority)})


def _alert(labels: Mapping[str, Any], ident: Mapping[str, str], since: float,
           value: float | None, evaluated_ago_s: float = 0.0) -> Alert | None:
    """The alert these labels describe, if it is this deployment's and one of the rules'.

    An alert whose ``action`` the controller does not know is read as ``inform``: a rule
    added later must never make the controller act on a guess. Only the rules' own alert
    names, severities and classes are read: the tenant picks the URL, and any other text
    in those labels would reach the CR's status (``lastAction``, the Tuning condition).
    """
    if any(labels.get(k) != v for k, v in ident.items()):
        return None
    if (labels.get("alertname") not in _NAMES or labels.get("severity") not in _SEVERITIES
            or labels.get("priority_class") not in _CLASSES):
        return None
    try:
        action = AlertAction(labels.get("action", ""))
    except ValueError:
        action = AlertAction.INFORM
    return Alert(name=labels["alertname"], action=action, severity=labels["severity"],
                 priority_class=labels["priority_class"], since=since, value=value,
                 evaluated_ago_s=evaluated_ago_s)


def _in_order(alerts: list[Alert]) -> list[Alert]:
    return sorted(alerts, key=lambda a: (a.since, a.name, a.priority_class))


_FIRING, _ACTIVE_AT = "ALERTS", "ALERTS_FOR_STATE"
_EVALUATED = "evaluated"
"""The ``alertstate`` the query gives the evaluation times of the firing alerts."""
_FIGURES = "|".join(sorted(set(VALUE_FIGURE.values())))


def alerts_query(deployment: str, namespace: str | None = None,
                 namespace_label: str | None = None) -> str:
    """PromQL for ``namespace/deployment``'s firing alerts and nothing of anyone else's.

    Selected in Prometheus by the identity labels (escaped by ``render_selector``): a
    controller that fetched ``/api/v1/alerts`` (every tenant's) each tick made N
    deployments cost the operator and Prometheus O(N^2). One instant query gives
    ``ALERTS`` (name, action, severity, class), ``ALERTS_FOR_STATE`` (activeAt, in whole
    seconds) and the recorded figures the alerts' values are (``VALUE_FIGURE``): the
    fields ``/api/v1/alerts`` gave. ``or`` keeps all three: their label sets differ.
    And when each firing alert was last evaluated: ``timestamp()`` of its ``ALERTS``
    sample (written at each evaluation), with ``alertstate="evaluated"``: ``or`` matches
    label sets without the metric's name, and under ``ALERTS``' own labels the time was
    dropped as a duplicate. The answer's own time is the query's, so the two give the
    verdict's age on Prometheus' clock alone (``Alert.evaluated_ago_s``).
    ``namespace_label``: the enforced namespace label, matched too (``identity_labels``).
    """
    ident = identity_labels(deployment, namespace, namespace_label)
    firing = render_selector({"alertstate": "firing", **ident})
    own = render_selector(ident)
    evaluated = (f'label_replace(timestamp({_FIRING}{firing}), "alertstate", '
                 f'"{_EVALUATED}", "", "")')
    return (f"{_FIRING}{firing} or {_ACTIVE_AT}{own} or {evaluated} "
            f'or {{__name__=~"{_FIGURES}",{own[1:-1]}}}')


def _alert_key(labels: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """An alert's labels as ALERTS and ALERTS_FOR_STATE both carry them."""
    return frozenset((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate"))


def parse_alert_series(result: Any, deployment: str, namespace: str | None = None,
                       namespace_label: str | None = None) -> list[Alert]:
    """Firing alerts of ``namespace/deployment`` from the result list of ``alerts_query``.

    The alerts ``/api/v1/alerts`` lists as firing, matched again here by identity (the
    URL is the tenant's: any server may answer). ``since`` is activeAt in
    whole seconds (0 where Prometheus wrote no ``ALERTS_FOR_STATE``), ``value`` the
    alert's figure as last recorded (None where there is none), ``evaluated_ago_s`` the
    query's time less the alert's last evaluation (0 where the answer has none: an
    older query's shape). With ``namespace_label``
    an alert must carry the namespace there too, as must the figures its value is read
    from.
    """
    ident = identity_labels(deployment, namespace, namespace_label)
    if not isinstance(result, list):
        raise PrometheusUnavailable("the alerts query: the answer has no result list")
    # Only this deployment's samples: a figure of another's must not give an alert its
    # value (the server may answer with more than the query asked for).
    samples = [(s["metric"], _value(s["value"][1])) for s in result if _is_sample(s)
               and all(s["metric"].get(k) == v for k, v in ident.items())]
    active_at = {_alert_key(m): v for m, v in samples if m.get("__name__") == _ACTIVE_AT}
    evaluated = {_alert_key(s["metric"]): _age(s["value"]) for s in result
                 if _is_sample(s) and "__name__" not in s["metric"]
                 and s["metric"].get("alertstate") == _EVALUATED}
    figures = {(m.get("__name__"), m.get("priority_class")): v for m, v in samples}
    out = []
    for labels, _ in samples:
        if labels.get("__name__") != _FIRING or labels.get("alertstate") != "firing":
            continue
        since = active_at.get(_alert_key(labels))
        alert = _alert(labels, ident, _seconds_or_zero(since), _figure_value(labels, figures),
                       evaluated.get(_alert_key(labels), 0.0))
        if alert is not None:
            out.append(alert)
    return _in_order(out)


def _age(value: list[Any]) -> float:
    """The query's time less the sample's timestamp (``[query time, "evaluated at"]``),
    never below 0; 0 where either is not a time."""
    at, then = _value(value[0]), _value(value[1])
    if at is None or then is None or not math.isfinite(at - then):
        return 0.0
    return max(at - then, 0.0)


def _seconds_or_zero(value: float | None) -> float:
    # 0 for a missing activeAt: it only orders the alerts.
    return value if value is not None and math.isfinite(value) else 0.0


def _is_sample(sample: Any) -> bool:
    return (isinstance(sample, dict) and isinstance(sample.get("metric"), dict)
            and isinstance(sample.get("value"), list) and len(sample["value"]) == 2)


def _figure_value(labels: Mapping[str, str],
                  figures: Mapping[tuple[Any, Any], float | None]) -> float | None:
    figure = VALUE_FIGURE.get(labels.get("alertname", ""))
    if figure is None:
        return None
    cls = labels.get("priority_class") if figure.per_class else None
    return figures.get((figure.value, cls))


class AlertSource:
    """Reads firing alerts of one deployment from a Prometheus server's HTTP API: one
    instant query (``alerts_query``) a tick, never the whole cluster's alert list."""

    def __init__(self, url: str, deployment: str, *, namespace: str | None = None,
                 namespace_label: str | None = None, verify: TLSVerify = VERIFIED,
                 timeout_s: float = 5.0, client: httpx.Client | None = None,
                 deadline_s: float = ANSWER_DEADLINE_S,
                 max_bytes: int = ALERTS_ANSWER_BYTES, charge: Charge | None = None,
                 offset_s: Callable[[], float] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus url {url!r}: expected http://host:port")
        if not deployment:
            raise ValueError("deployment is empty; pass the LLMDeployment's name")
        # Checks the identity, as parse does.
        self.expr = alerts_query(deployment, namespace, namespace_label)
        self.url = url.rstrip("/")
        self.deployment, self.namespace = deployment, namespace
        self.namespace_label = namespace_label
        self.verify = verify
        """How an https server's certificate is checked (unless ``client`` is given)."""
        self._client = client or bounded_client(timeout_s, verify=verify)
        # query_at reads within the bounds, and its errors never quote the body. The cap:
        # what one deployment's alerts can be (bounded.ALERTS_ANSWER_BYTES), not more:
        # this query runs every tick.
        self._query = query_at(self.url, timeout_s, client=self._client,
                               deadline_s=deadline_s, max_bytes=max_bytes, charge=charge)
        self.offset_s = offset_s
        """The reader's clock less Prometheus's (``clock_offset.PrometheusClock``), or
        None: each alert's ``since`` (activeAt, Prometheus's clock) is moved by it onto
        the clock the loop compares it with (its last action's time)."""

    def firing(self) -> list[Alert]:
        alerts = parse_alert_series(self._query(self.expr, None), self.deployment,
                                    self.namespace, self.namespace_label)
        shift = self.offset_s() if self.offset_s is not None else 0.0
        if not shift:
            return alerts
        # A missing activeAt (0) only orders the alerts: kept first.
        return [replace(a, since=a.since + shift) if a.since else a
                for a in alerts]

    def close(self) -> None:
        self._client.close()


def summary_figure(summary: WindowSummary, figure: Figure, cls: str) -> float | None:
    """What the recorded series ``figure`` would hold for this window (None: no data).

    The caller picks the window: ``rate_window_s``, or ``breach_window_s`` for the
    figures with ``long_window``.

    Latencies in seconds, as the series has them. Utilization is the GPU's where the
    summary has it and the executor's busy ratio otherwise, as the recording rule's ``or``.
    """
    if figure.per_class:
        per = summary.classes[Priority.parse(cls)]
        ms = per.ttft_p99_ms if figure.is_ttft else per.tbt_p99_ms
        return None if ms is None else ms / 1000
    if figure is Figure.UTILIZATION:
        gpu = summary.gpu_utilization
        return gpu if gpu is not None else summary.busy_ratio
    return {Figure.PREEMPTIONS_PER_MIN: summary.preemptions_per_min,
            Figure.REQUESTS_WAITING: summary.requests_waiting,
            Figure.PREFIX_HIT_RATIO: summary.prefix_cache_hit_ratio,
            Figure.STALLED_REPLICAS: summary.stalled_replicas,
            Figure.TARGETS_DOWN: summary.targets_down}[figure]


class SummaryAlerts:
    """The alert table evaluated on window summaries, as Prometheus evaluates the rules.

    For where no Prometheus evaluates the rules: the virtual-time simulator and the
    direct-scrape fallback of the demo. ``evaluate(summary, now, long)`` is one evaluation
    of the group at ``now``, on the summary of the last ``rate_window_s`` and that of the
    last ``breach_window_s`` (a summary of None, a window that did not count, is no data:
    every condition on it is false). ``firing(now, summary_at)`` is what
    ``/api/v1/alerts`` would list at ``now``: it runs every evaluation due since the last,
    one per ``interval_s``, on ``summary_at(t, window_s)``, and between evaluations
    repeats the last verdict, ``evaluated_ago_s`` saying how old it is.
    """

    def __init__(self, slo: SLOSpec, options: RuleOptions) -> None:
        self.slo, self.opt = slo, options
        self.rules: tuple[AlertRule, ...] = alert_table(slo, options)
        self._long = any(c.figure.long_window for r in self.rules for c in r.conditions)
        self._pending: dict[tuple[str, str, str], float] = {}
        self._last: float | None = None
        self._firing: list[Alert] = []
        # Evaluations enough to rebuild any alert's state after a long gap.
        longest = max((r.for_s for r in self.rules), default=0)
        self._catch_up = math.ceil(longest / options.interval_s) + 1

    def _holding(self, summary: WindowSummary | None, long: WindowSummary | None
                 ) -> dict[tuple[str, str, str], tuple[AlertRule, float | None]]:
        """The rules whose every condition holds, with the first condition's value."""
        out = {}
        for rule in self.rules:
            values = []
            for c in rule.conditions:
                window = long if c.figure.long_window else summary
                values.append(None if window is None else
                              summary_figure(window, c.figure, rule.priority_class))
            if all(c.holds(v) for c, v in zip(rule.conditions, values, strict=True)):
                out[(rule.name, rule.priority_class, rule.severity.value)] = (rule, values[0])
        return out

    def evaluate(self, summary: WindowSummary | None, now: float,
                 long: WindowSummary | None = None) -> list[Alert]:
        active = self._holding(summary, long)
        self._pending = {k: t for k, t in self._pending.items() if k in active}
        out = []
        for key, (rule, value) in active.items():
            since = self._pending.setdefault(key, now)
            if now - since >= rule.for_s:
                out.append(Alert(rule.name, rule.action, rule.severity.value,
                                 rule.priority_class, since, value))
        self._last, self._firing = now, out
        return list(out)

    def firing(self, now: float,
               summary_at: Callable[[float, float], WindowSummary | None]) -> list[Alert]:
        interval = self.opt.interval_s
        if self._last is None:
            due = [now]
        else:
            n = math.floor((now - self._last) / interval + 1e-9)
            due = [self._last + i * interval for i in range(1, n + 1)]
            if len(due) > self._catch_up:
                # A gap longer than any hold: what happened in it is unknown, start over.
                due, self._pending = due[-self._catch_up:], {}
        for t in due:
            long = summary_at(t, self.opt.breach_window_s) if self._long else None
            self.evaluate(summary_at(t, self.opt.rate_window_s), t, long)
        # Between evaluations the verdict is the last one's, as Prometheus answers: its
        # age says so, and which window it read (``Alert.evaluated_ago_s``).
        ago = now - self._last if self._last is not None else 0.0
        return [dataclasses.replace(a, evaluated_ago_s=max(ago, 0.0)) for a in self._firing]
