"""A deployment's objectives as recorded series: the lines its dashboard draws.

One dashboard serves every LLMDeployment, chosen by namespace and name, and each has its
own targets: a strict profile's P1 TBT is 50 ms, a relaxed one's 200 ms; a CR may give
P2 a TTFT target, expect a prefix hit ratio, or lower the batching alert's utilization
floor. So the rules (``rules.py``) record each target the deployment has as a constant
series under its identity labels, and the dashboard draws its lines from them
(``operator/dashboards.py``). An objective the deployment does not have records
nothing: no line, rather than one the alerts do not hold it to.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.alert_table import RuleOptions

TTFT_P99_SLO = "slopilot:slo_ttft_p99:seconds"
"""A class's TTFT P99 target (``priority_class``)."""
TBT_P99_SLO = "slopilot:slo_tbt_p99:seconds"
"""A class's TBT P99 target (``priority_class``)."""
PREEMPTIONS_SLO = "slopilot:slo_preemptions_max:per_minute"
"""The engine-wide preemption limit (``SLOSpec.max_preemptions_per_min``)."""
PREFIX_HIT_SLO = "slopilot:slo_prefix_hit_min:ratio"
"""The least prefix cache hit ratio expected (``SLOSpec.prefix_hit_min``)."""
UTILIZATION_FLOOR = "slopilot:alert_utilization_min:ratio"
"""Not an SLO: the batching alert's utilization floor (``spec.alerts.utilizationMin``)."""


@dataclass(frozen=True, slots=True)
class Objective:
    """One target, in its recorded series' unit (seconds for latencies)."""

    series: str
    value: float
    priority_class: str | None = None
    """p0/p1/p2 for a class's target; None for the engine-wide ones."""


def objectives(slo: SLOSpec, options: RuleOptions) -> list[Objective]:
    """Every target the deployment has, each with the very value its alert compares
    with (``alert_table``): a class's P99 targets where it has them, the engine-wide
    limits where it sets them, and the batching alert's floor, which it always has."""
    out = []
    for p, target in slo.classes().items():
        for series, ms in ((TTFT_P99_SLO, target.ttft_p99_ms),
                           (TBT_P99_SLO, target.tbt_p99_ms)):
            if ms is not None:
                out.append(Objective(series, ms / 1000, p.label))
    if slo.max_preemptions_per_min is not None:
        out.append(Objective(PREEMPTIONS_SLO, slo.max_preemptions_per_min))
    if slo.prefix_hit_min is not None:
        out.append(Objective(PREFIX_HIT_SLO, slo.prefix_hit_min))
    out.append(Objective(UTILIZATION_FLOOR, options.busy_ratio_min))
    return out
