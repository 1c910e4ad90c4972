"""``spec.alerts``: the alert table's thresholds as a CR author writes them.

``spec.py`` reads the fields (typed, ``holdFor`` parsed into seconds); here they become
the tuner's ``RuleOptions``, with the cross-field rule the schema cannot state and every
problem named by its CRD field. ``crd.py`` builds the schema from the same map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from slopilot.engine.alert_factors import AlertFactors
from slopilot.engine.slo import SLOSpec
from slopilot.operator.pod_layout import SCRAPE_INTERVAL_S
from slopilot.tuner.prometheus.alert_table import MAX_SAID_SCRAPE_INTERVAL_S, rate_window_for
from slopilot.tuner.prometheus.rules import LatencySources, RuleError, RuleOptions, duration

# spec.alerts field -> RuleOptions field. The holds are durations, the two counts integers.
# ``scrapeInterval`` is no field of its own there: it sets ``rate_window_s``.
SCRAPE_FIELD = "scrape_interval_s"
ALERT_FIELDS = {"tbtScaleFactor": "tbt_factor", "tbtPeriods": "tbt_periods",
                "ttftWarningFactor": "ttft_warning_factor",
                "ttftRetuneFactor": "ttft_retune_factor", "holdFor": "alert_for_s",
                "sustainedBreachWindow": "breach_window_s",
                "utilizationMin": "busy_ratio_min", "waitingMin": "waiting_min",
                "scrapeInterval": SCRAPE_FIELD}
INTEGER_FIELDS = frozenset({"tbtPeriods", "waitingMin"})
DURATION_FIELDS = frozenset({"holdFor", "sustainedBreachWindow", "scrapeInterval"})
DEFAULT_SCRAPE_INTERVAL_S = SCRAPE_INTERVAL_S
"""What ``spec.alerts.scrapeInterval`` defaults to: the ServiceMonitor's."""
MAX_SCRAPE_INTERVAL_S = MAX_SAID_SCRAPE_INTERVAL_S
"""The longest ``scrapeInterval`` (``alert_table.MAX_SAID_SCRAPE_INTERVAL_S``)."""


OLD_SCHEMA_BREACH_WINDOW_S = 300
"""What the CRD once stored in every CR's ``sustainedBreachWindow`` as its default (it
has none now): under a long interval's rate window such a CR is read as having none."""


def alert_options(values: Mapping[str, Any], warnings: list[str] | None = None
                  ) -> tuple[RuleOptions, list[str]]:
    """RuleOptions from ``{camelCase field: value}``; the defaults and problems where bad.
    A field read in another meaning than written appends to ``warnings``."""
    given = {ALERT_FIELDS[k]: v for k, v in values.items()}
    defaults = RuleOptions()
    scrape_s = given.pop(SCRAPE_FIELD, None)
    if scrape_s is not None:
        if isinstance(scrape_s, bool) or not isinstance(scrape_s, int) \
                or not 1 <= scrape_s <= MAX_SCRAPE_INTERVAL_S:
            return defaults, [f"spec.alerts.scrapeInterval={scrape_s!r}: expected whole "
                              f"seconds in [1, {MAX_SCRAPE_INTERVAL_S}] (the interval "
                              "Prometheus scrapes the pods at, e.g. 30s)"]
        # Rates over four scrapes (``MIN_RATE_SCRAPES``); the sustained rows' window, left
        # at its default, at least as long.
        given["rate_window_s"] = rate_window_for(scrape_s, defaults.rate_window_s)
        rate_s = given["rate_window_s"]
        if given.get("breach_window_s") == OLD_SCHEMA_BREACH_WINDOW_S < rate_s:
            # Written or stored by the old schema default, the API server cannot tell
            # (it refuses it now): refusing would leave an upgraded CR without rules.
            del given["breach_window_s"]
            if warnings is not None:
                warnings.append(
                    f"spec.alerts.sustainedBreachWindow="
                    f"{duration(OLD_SCHEMA_BREACH_WINDOW_S)!r} is under the "
                    f"{duration(rate_s)} rate window of spec.alerts.scrapeInterval="
                    f"{duration(scrape_s)!r}: read as left out (the CRD once stored "
                    f"{duration(OLD_SCHEMA_BREACH_WINDOW_S)} in every CR), the rules use "
                    f"{duration(max(defaults.breach_window_s, rate_s))}; remove the field, "
                    f"or set at least {duration(rate_s)} (the API server refuses it on "
                    "the CR's next change)")
        given.setdefault("breach_window_s",
                         max(defaults.breach_window_s, given["rate_window_s"]))
    warn = given.get("ttft_warning_factor", defaults.ttft_warning_factor)
    retune = given.get("ttft_retune_factor", defaults.ttft_retune_factor)
    if warn > retune:
        return defaults, [f"spec.alerts.ttftWarningFactor={warn:g} exceeds "
                          f"spec.alerts.ttftRetuneFactor={retune:g}: the warning (inform) "
                          "must come before the retune; lower the one or raise the other"]
    try:
        return RuleOptions(**given), []
    except RuleError as exc:
        # Name every field as the CR author wrote it (a message may name two).
        message = str(exc)
        for camel, name in ALERT_FIELDS.items():
            message = re.sub(rf"\b{name}=", f"spec.alerts.{camel}=", message)
        message = re.sub(r"\brate_window_s=(\d+)", r"\1 s (the rules' rate window: 1m, "
                         "or four spec.alerts.scrapeInterval where longer)", message)
        return defaults, [message]


def edge_factors(options: RuleOptions) -> AlertFactors:
    """The factors of ``options`` the pods make edges of (``latency_buckets.slo_edges``):
    the ones its latency rows multiply an SLO target by, read from the same fields, so
    that every threshold the rules judge is an edge of the histograms they read."""
    return AlertFactors(ttft_warning=options.ttft_warning_factor,
                        ttft_retune=options.ttft_retune_factor,
                        tbt_scale=options.tbt_factor)


def unreachable_rows(slo: SLOSpec, options: RuleOptions, latency: LatencySources
                     ) -> list[str]:
    """A warning for each latency row whose threshold is at or past the last finite edge
    of every histogram its P99 is read from: a quantile reads at most that edge (the +Inf
    bucket has no width to spread over), so ``P99 > threshold`` never holds and the row
    never fires, however slow the class gets. Not a problem: the SLO itself stands, and
    the trials judge it; only these alerts are mute."""
    out = []
    for p, target in slo.classes().items():
        cls = p.label
        for figure, ms, camel, source, rows in (
                ("TTFT", target.ttft_p99_ms, "ttftP99Ms", latency.ttft,
                 (("spec.alerts.ttftWarningFactor", options.ttft_warning_factor,
                   "SlopilotTTFTP99High (warning) and SlopilotTTFTP99Sustained"),
                  ("spec.alerts.ttftRetuneFactor", options.ttft_retune_factor,
                   "SlopilotTTFTP99High (critical)"))),
                ("TBT", target.tbt_p99_ms, "tbtP99Ms", latency.tbt,
                 (("spec.alerts.tbtScaleFactor", options.tbt_factor, "SlopilotTBTP99High"),
                  (None, 1.0, "SlopilotTBTP99Sustained")))):
            if ms is None:
                continue
            edge = max(h.edges[-1] for h in (source.engine, source.client) if h is not None)
            for field, factor, alerts in rows:
                threshold = factor * ms / 1000
                if threshold < edge:
                    continue
                times = "" if field is None else f"{field}={factor:g} x "
                fix = (f"lower {field} or the SLO" if field is not None else "lower the SLO")
                out.append(
                    f"{times}spec.slo.classes.{cls}.{camel}={ms:g} is {threshold:g} s, at or past "
                    f"{edge:g} s, the last finite edge of the {figure} histograms the rules "
                    f"read: a P99 reads at most {edge:g} s, so {alerts} of {cls} can never "
                    f"fire; {fix} so that the product stays under {edge:g} s")
    return out
