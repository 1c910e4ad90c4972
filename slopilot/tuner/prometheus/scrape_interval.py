"""How often Prometheus really scrapes a deployment's targets, read from its own samples.

The recording rules read ``RuleOptions.rate_window_s`` (60 s) rates, and ``rate()``
reads nothing of fewer than two samples in its range: scraped less often than every
half of it, the P99s read no data, so no alert ever fires and the loop never acts (at
60 s scrapes a p0 TTFT of 2.0 s held 10 minutes never fired ``SlopilotTTFTP99High``,
where 15 s and 30 s did). The operator's ServiceMonitor scrapes every 15 s, but a
Prometheus that does not honour ServiceMonitors (a plain job, 1 m by default) or an
edited interval does not. ``up`` has one sample per scrape of each target, a failed
one too (0), so the spacing of its raw samples (``up{...}[15m]``) is the interval
itself, exact to Prometheus's millisecond timestamps;
``prometheus_target_interval_length_seconds`` carries no target labels, so it cannot tell
this deployment's job from another's.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from slopilot.tuner.prometheus.alert_table import RuleOptions
from slopilot.tuner.prometheus.query import QueryAt
from slopilot.tuner.prometheus.rules import render_selector

MAX_SCRAPE_INTERVAL_S = RuleOptions().rate_window_s / 2
"""The longest scrape interval the rules read (30 s): two samples in every 60 s rate."""
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

    @property
    def too_long(self) -> bool:
        return self.interval_s > MAX_SCRAPE_INTERVAL_S

    def describe(self) -> str:
        return (f"Prometheus scrapes {self.instance} every {self.interval_s:.0f} s "
                f"(median gap of its last {self.samples} up samples)")

    def problem(self) -> str:
        """What breaks and the fix, for a status or a rejected window."""
        rate_s = RuleOptions().rate_window_s
        return (f"{self.describe()}, longer than the {MAX_SCRAPE_INTERVAL_S:.0f} s the "
                f"recording rules read: their {rate_s} s rates need two samples, so they "
                "read no data, the alerts never fire and the loop never acts; set "
                "scrape_interval: 15s on the scrape job of these pods, or let "
                "prometheus-operator scrape them with the operator's ServiceMonitor "
                "(every 15 s)")


def scrape_interval(query: QueryAt, selector: Mapping[str, str],
                    at: float | None = None) -> ScrapeInterval | None:
    """The slowest-scraped target of ``selector`` over the ``LOOKBACK_S`` before ``at``
    (None: Prometheus's now); None where no target left ``MIN_INTERVALS`` gaps (just
    started, or no target at all: the windows say that)."""
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
                                     len(times))
    return slowest
