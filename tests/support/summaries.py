"""Window summaries from the few figures a test cares about."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary

_COUNTS = {"requests_finished": 0.0, "throughput_tok_s": 0.0, "goodput_tok_s": 0.0}
_LATENCIES = {"ttft_p99_ms": None, "tbt_p99_ms": None}


def _clean(values: Mapping[str, Any]) -> dict[str, Any]:
    # Prometheus' NaN ("no samples") is None in a summary.
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in values.items()}


def partial_summary(figures: Mapping[str, Any]) -> WindowSummary:
    """A WindowSummary holding ``figures`` (the dict form's keys), every other count zero
    and every other latency absent."""
    classes = figures.get("classes") or {}
    data: dict[str, Any] = {**_COUNTS, **_LATENCIES, "duration_s": 60.0,
                            "preemptions_per_min": 0.0,
                            **_clean({k: v for k, v in figures.items() if k != "classes"})}
    if data["preemptions_per_min"] is None:
        # As the live builder reads it (prometheus/query.window_summary): no series, none.
        data["preemptions_per_min"] = 0.0
    data["classes"] = {p.label: {**_COUNTS, **_LATENCIES,
                                 **_clean(classes.get(p.label) or {})} for p in Priority}
    return WindowSummary.from_dict(data)
