"""Firing alerts of one deployment, read from Prometheus and routed by their action label.

The rules (``rules.py``) label every alert with ``action`` (what the controller should
do) and ``slopilot_deployment`` (whose it is); this module turns Prometheus'
``/api/v1/alerts`` answer into typed ``Alert`` objects for one deployment.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, RuleOptions
from slopilot.tuner.prometheus.safe_errors import http_failure, transport_failure
from slopilot.tuner.study.evaluator import PrometheusUnavailable

__all__ = ["Alert", "AlertAction", "AlertSource", "PrometheusUnavailable", "parse_alerts"]


class AlertAction(enum.StrEnum):
    RETUNE = "retune"
    SCALE = "scale"
    INFORM = "inform"


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    action: AlertAction
    severity: str
    priority_class: str
    since: float
    """Unix time the condition became active (Prometheus' activeAt)."""
    value: float | None = None

    def describe(self) -> str:
        return f"{self.name}[{self.priority_class},{self.severity}]"


def _since(text: Any) -> float:
    if not isinstance(text, str) or not text:
        return 0.0
    # Prometheus writes RFC 3339 with up to nanoseconds; fromisoformat takes microseconds.
    head, dot, frac = text.rstrip("Z").partition(".")
    stamp = head + (("." + frac[:6]) if dot else "") + "+00:00"
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def _value(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def parse_alerts(answer: Any, deployment: str) -> list[Alert]:
    """Firing alerts of ``deployment`` from an ``/api/v1/alerts`` answer (pending ones wait).

    An alert whose ``action`` the controller does not know is read as ``inform``: a rule
    added later must never make the controller act on a guess.
    """
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise PrometheusUnavailable("/api/v1/alerts: not a Prometheus success answer")
    data = answer.get("data")
    rows = data.get("alerts") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise PrometheusUnavailable("/api/v1/alerts: the answer has no data.alerts list")
    out = []
    for row in rows:
        labels = row.get("labels") or {}
        if row.get("state") != "firing" or labels.get(DEPLOYMENT_LABEL) != deployment:
            continue
        try:
            action = AlertAction(labels.get("action", ""))
        except ValueError:
            action = AlertAction.INFORM
        out.append(Alert(name=labels.get("alertname", "?"), action=action,
                         severity=labels.get("severity", ""),
                         priority_class=labels.get("priority_class", ""),
                         since=_since(row.get("activeAt")), value=_value(row.get("value"))))
    out.sort(key=lambda a: (a.since, a.name, a.priority_class))
    return out


class AlertSource:
    """Reads firing alerts of one deployment from a Prometheus server's HTTP API."""

    def __init__(self, url: str, deployment: str, *, timeout_s: float = 5.0,
                 client: httpx.Client | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus url {url!r}: expected http://host:port")
        if not deployment:
            raise ValueError("deployment is empty; pass the LLMDeployment's name")
        self.url = url.rstrip("/")
        self.deployment = deployment
        self._client = client or httpx.Client(timeout=timeout_s)

    def firing(self) -> list[Alert]:
        # Messages name the status code and content type, never the body (safe_errors).
        where = f"Prometheus at {self.url}"
        try:
            resp = self._client.get(self.url + "/api/v1/alerts")
        except httpx.HTTPError as exc:
            raise PrometheusUnavailable(
                f"{where} is unreachable: {transport_failure(exc)}") from None
        ctype = resp.headers.get("content-type")
        if resp.status_code != 200:
            raise PrometheusUnavailable(f"{where}: /api/v1/alerts answered "
                                        f"{http_failure(resp.status_code, ctype)}")
        try:
            answer = resp.json()
        except ValueError:
            raise PrometheusUnavailable(f"{where}: /api/v1/alerts answered "
                                        f"{http_failure(200, ctype, 'not JSON')}") from None
        try:
            return parse_alerts(answer, self.deployment)
        except PrometheusUnavailable as exc:
            raise PrometheusUnavailable(f"{where}: {http_failure(200, ctype)}: {exc}") from None

    def close(self) -> None:
        self._client.close()


class SummaryAlerts:
    """The alert rules' conditions, with their ``for:`` hold times, on a DESIGN §8 summary.

    For where no Prometheus evaluates the rules: the virtual-time simulator and the
    direct-scrape fallback of the demo. Call ``evaluate`` with each new window's summary
    (None when the window did not count: pending conditions are dropped).
    """

    def __init__(self, slo: SLOSpec, options: RuleOptions) -> None:
        self.slo, self.opt = slo, options
        self._pending: dict[tuple[str, str, str], float] = {}

    def evaluate(self, summary: Mapping[str, Any] | None, now: float) -> list[Alert]:
        active: list[tuple[str, str, str, AlertAction, float]] = []
        if summary is not None:
            active = self._conditions(summary)
        keys = {(n, c, sev) for n, c, sev, _, _ in active}
        self._pending = {k: t for k, t in self._pending.items() if k in keys}
        out = []
        for name, c, sev, action, hold in active:
            since = self._pending.setdefault((name, c, sev), now)
            if now - since >= hold:
                out.append(Alert(name, action, sev, c, since))
        return out

    def _conditions(self, s: Mapping[str, Any]) -> list[tuple[str, str, str, AlertAction, float]]:
        opt = self.opt
        active: list[tuple[str, str, str, AlertAction, float]] = []
        for p in Priority:
            c, per, cls_slo = p.label, s["classes"][p.label], self.slo.class_slo(p)
            tbt, ttft = per["tbt_p99_ms"], per["ttft_p99_ms"]
            if cls_slo.tbt_p99_ms is not None and tbt is not None \
                    and tbt > 2 * cls_slo.tbt_p99_ms:
                active.append(("SlopilotTBTP99High", c, "critical", AlertAction.SCALE,
                               opt.tbt_periods * opt.interval_s))
            for factor, severity in ((1, "warning"), (2, "critical")):
                if cls_slo.ttft_p99_ms is not None and ttft is not None \
                        and ttft > factor * cls_slo.ttft_p99_ms:
                    active.append(("SlopilotTTFTP99High", c, severity, AlertAction.RETUNE,
                                   opt.alert_for_s))
        limit = self.slo.max_preemptions_per_min
        if limit is not None and s["preemptions_per_min"] > limit:
            active.append(("SlopilotPreemptionStorm", "all", "warning", AlertAction.RETUNE,
                           opt.alert_for_s))
        return active
