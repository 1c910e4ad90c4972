"""How often Prometheus really scrapes a deployment's targets, read from its own samples.

The recording rules read ``RuleOptions.rate_window_s`` rates (60 s, or four of
``spec.alerts.scrapeInterval`` where that is longer), and ``rate()`` reads nothing of
fewer than two samples in its range. Scraped less often than every quarter of it
(``MIN_RATE_SCRAPES``), one failed scrape leaves a rate too few samples and the 60 s
alerts clear (a review's promtool run at 30 s scrapes: with one failed every 180 s,
``SlopilotTTFTP99High`` never fired in 15 minutes); less often than every half of it,
the P99s read no data at all, so no alert ever fires and the loop never acts (at 60 s
scrapes a p0 TTFT of 2.0 s held 10 minutes never fired). The operator's ServiceMonitor
scrapes every 15 s, but a Prometheus that does not honour ServiceMonitors (a plain job,
1 m by default) or an edited interval does not. ``up`` has one sample per scrape of
each target, a failed one too (0), so the spacing of its raw samples (``up{...}[15m]``)
is the interval itself, exact to Prometheus's millisecond timestamps;
``prometheus_target_interval_length_seconds`` carries no target labels, so it cannot tell
this deployment's job from another's.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from slopilot.tuner.prometheus.alert_table import (
    MAX_SAID_SCRAPE_INTERVAL_S,
    MIN_RATE_SCRAPES,
    RuleOptions,
)
from slopilot.tuner.prometheus.query import QueryAt
from slopilot.tuner.prometheus.rules import duration, render_selector

MAX_SCRAPE_INTERVAL_S = RuleOptions().max_scrape_interval_s
"""The longest scrape interval the default rules read (15 s): four in every 60 s rate. A
deployment whose ``spec.alerts.scrapeInterval`` is longer reads longer rates, and takes
its own (``RuleOptions.max_scrape_interval_s``)."""
SLACK = 1.1
"""A measured median a tenth over the longest is still within it: the ServiceMonitor's
15 s reads 15.001 s where a scrape took a millisecond longer."""
LOOKBACK_S = 900
"""The raw samples a reading spans: fifteen of 60 s scrapes, sixty of 15 s ones (a few
kB per target, once a window), and enough gaps to judge any interval up to 5 minutes
(past it Prometheus's own 5 m lookback loses every series between scrapes anyway)."""
MIN_INTERVALS = 3
"""The gaps a target's samples must give before its interval is judged: a replica that
just started (two samples) has one gap, which may be its first scrape's offset rather
than its interval."""
REPLICA_LABEL = "instance"


@dataclass(frozen=True)
class ScrapeInterval:
    """The longest interval at which one of the deployment's targets is scraped."""

    instance: str
    interval_s: float
    """The median gap between its ``up`` samples (a missed scrape is no gap: ``up`` is
    written 0 then)."""
    samples: int
    most_s: float = MAX_SCRAPE_INTERVAL_S
    """The longest interval the deployment's rules read (``max_scrape_interval_s``)."""

    @property
    def too_long(self) -> bool:
        return self.interval_s > self.most_s * SLACK

    def describe(self) -> str:
        return (f"Prometheus scrapes {self.instance} every {self.interval_s:.0f} s "
                f"(median gap of its last {self.samples} up samples)")

    def _said(self) -> str:
        """The advice to say the interval, where the field takes it."""
        whole_s = math.ceil(self.interval_s)
        if whole_s <= MAX_SAID_SCRAPE_INTERVAL_S:
            return (f"set spec.alerts.scrapeInterval to {whole_s}s (the rates then span "
                    f"{MIN_RATE_SCRAPES} scrapes), or ")
        # No value of the field fits: only a faster scrape job mends it.
        return (f"spec.alerts.scrapeInterval takes at most "
                f"{duration(MAX_SAID_SCRAPE_INTERVAL_S)}, so the pods must be scraped at "
                f"most every {duration(MAX_SAID_SCRAPE_INTERVAL_S)}: ")

    def problem(self) -> str:
        """What breaks and the fix, for a status or a rejected window."""
        rate_s = self.most_s * MIN_RATE_SCRAPES
        return (f"{self.describe()}, longer than the {self.most_s:.0f} s the recording "
                f"rules read: their {rate_s:.0f} s rates need {MIN_RATE_SCRAPES} samples, "
                "so a failed scrape clears the alerts, or they read no data, the alerts "
                f"never fire and the loop never acts; {self._said()}"
                "scrape_interval: 15s on the scrape job of these pods, or let "
                "prometheus-operator scrape them with the operator's ServiceMonitor "
                "(every 15 s)")


def scrape_interval(query: QueryAt, selector: Mapping[str, str],
                    at: float | None = None, most_s: float = MAX_SCRAPE_INTERVAL_S
                    ) -> ScrapeInterval | None:
    """The slowest-scraped target of ``selector`` over the ``LOOKBACK_S`` before ``at``
    (None: Prometheus's now); None where no target left ``MIN_INTERVALS`` gaps (just
    started, or no target at all: the windows say that). ``most_s``: the longest
    interval the deployment's rules read."""
    answer = query(f"up{render_selector(selector)}[{LOOKBACK_S}s]", at)
    slowest: ScrapeInterval | None = None
    for series in answer:
        times = sorted(float(t) for t, _ in series.get("values") or ())
        gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
        if len(gaps) < MIN_INTERVALS:
            continue
        median = statistics.median(gaps)
        if not math.isfinite(median):
            continue
        if slowest is None or median > slowest.interval_s:
            slowest = ScrapeInterval(series["metric"].get(REPLICA_LABEL, "?"), median,
                                     len(times), most_s)
    return slowest
