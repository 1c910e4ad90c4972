"""The ``ScrapeInterval`` condition: whether Prometheus scrapes the deployment's pods
often enough for the recording rules to read them, once a window.

At more than the rules read (``RuleOptions.max_scrape_interval_s``: four scrapes in each
rate, 15 s by default, ``spec.alerts.scrapeInterval`` where it is longer; a Prometheus
that ignores the ServiceMonitor and scrapes at its 1 m default) one failed scrape clears
the alerts, or the rules' rates read no data and the loop silently never acts; the
condition (False, ``TooLong``) names the interval measured, what breaks and the fix, and
``kubectl describe`` shows an event when it turns so. Read through the
controller's own window evaluator (``PrometheusWindows.scrape_interval``: the same
query, on Prometheus's clock, and selector as every window); a controller built with
another evaluator (a factory's) has none, and nothing is said.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf

from slopilot.operator.conditions import ConditionType, condition
from slopilot.tuner.loop.ports import WindowEvaluator
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.study.evaluator import PrometheusUnavailable

log = logging.getLogger(__name__)

MIN_EVERY_S = 60.0
"""Read at most this often: a tuning.window of seconds would read it every tick."""
TOO_LONG, WITHIN = "TooLong", "WithinRules"


class ScrapeCheck:
    """Reads the interval once ``every_s`` from ``start``; ``due`` gives the condition."""

    def __init__(self, evaluator: WindowEvaluator, every_s: float, start: float) -> None:
        self.windows = evaluator if isinstance(evaluator, PrometheusWindows) else None
        self.every_s, self.since = max(float(every_s), MIN_EVERY_S), start

    def due(self, now: float) -> dict[str, Any] | None:
        """The ``ScrapeInterval`` condition measured now; None before it is due, or when
        nothing is measured (Prometheus down, targets just started or gone: the windows
        and the other conditions say those), so the last one stays."""
        if now < self.since:  # the clock stepped back
            self.since = now
        if self.windows is None or now - self.since < self.every_s:
            return None
        self.since = now
        try:
            found = self.windows.scrape_interval(None)
        except PrometheusUnavailable as exc:
            log.debug("scrape interval not read: %s", exc)
            return None
        if found is None:
            return None
        if found.too_long:
            return condition(ConditionType.SCRAPE_INTERVAL, False, TOO_LONG, found.problem())
        return condition(ConditionType.SCRAPE_INTERVAL, True, WITHIN,
                         f"{found.describe()}: within the {found.most_s:.0f} s "
                         "the recording rules read")


def scrape_event(body: Mapping[str, Any], said: Mapping[str, Any]) -> None:
    """The event ``kubectl describe`` shows when the condition turns False."""
    kopf.warn(cast("kopf.Body", body), reason="ScrapeIntervalTooLong",
              message=str(said["message"]))
