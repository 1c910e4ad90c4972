"""``spec.alerts``: the alert table's thresholds as a CR author writes them.

``spec.py`` reads the fields (typed, ``holdFor`` parsed into seconds); here they become
the tuner's ``RuleOptions``, with the cross-field rule the schema cannot state and every
problem named by its CRD field. ``crd.py`` builds the schema from the same map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from slopilot.tuner.prometheus.rules import RuleError, RuleOptions

# spec.alerts field -> RuleOptions field. The holds are durations, the two counts integers.
ALERT_FIELDS = {"tbtScaleFactor": "tbt_factor", "tbtPeriods": "tbt_periods",
                "ttftWarningFactor": "ttft_warning_factor",
                "ttftRetuneFactor": "ttft_retune_factor", "holdFor": "alert_for_s",
                "sustainedBreachWindow": "breach_window_s",
                "utilizationMin": "busy_ratio_min", "waitingMin": "waiting_min"}
INTEGER_FIELDS = frozenset({"tbtPeriods", "waitingMin"})
DURATION_FIELDS = frozenset({"holdFor", "sustainedBreachWindow"})


def alert_options(values: Mapping[str, Any]) -> tuple[RuleOptions, list[str]]:
    """RuleOptions from ``{camelCase field: value}``; the defaults and problems where bad."""
    given = {ALERT_FIELDS[k]: v for k, v in values.items()}
    defaults = RuleOptions()
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
        return defaults, [message]
