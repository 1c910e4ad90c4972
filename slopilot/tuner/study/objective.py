"""The objective: goodput to maximize, SLO terms as Optuna constraints.

A summary (the simulator's DESIGN §8 dict, or the Prometheus evaluator's equivalent)
becomes a ``TrialResult``. Each SLO term becomes one constraint ``measured / limit - 1``:
Optuna counts a trial feasible when every constraint is <= 0, and normalizing by the
limit makes terms of different units comparable (0.5 means 50 % over, whichever term).

Terms, in this fixed order: for each class p0, p1, p2, its TTFT P99 and then its TBT P99
where the SLO sets them; then the engine-wide preemptions per minute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.slo import SLOSpec

# A class that served nothing in the window has no P99 (NaN from Prometheus, None in a
# summary); it breaks no SLO (its goodput is zero, which the objective already counts),
# so its term reads as comfortably met.
NO_SAMPLES = -1.0


class SummaryError(ValueError):
    """A summary lacks a figure the objective needs; the message names it."""


def constraint_names(slo: SLOSpec) -> tuple[str, ...]:
    """Names of the constraint terms ``score`` returns for ``slo``, in the same order."""
    names: list[str] = []
    for p, c in slo.classes().items():
        if c.ttft_p99_ms is not None:
            names.append(f"{p.label}.ttft_p99")
        if c.tbt_p99_ms is not None:
            names.append(f"{p.label}.tbt_p99")
    if slo.max_preemptions_per_min is not None:
        names.append("preemptions_per_min")
    return tuple(names)


@dataclass(frozen=True)
class TrialResult:
    """One evaluated configuration."""

    config: Mapping[str, Any]
    goodput_tok_s: float
    constraints: tuple[float, ...]
    """Optuna form: feasible when every value is <= 0 (``measured / limit - 1``)."""
    feasible: bool
    summary: Mapping[str, Any] = field(default_factory=dict)
    constraint_names: tuple[str, ...] = ()

    @property
    def violation(self) -> float:
        """Sum of the positive constraint values: 0 when feasible, larger when worse."""
        return sum(max(0.0, c) for c in self.constraints)

    def to_dict(self) -> dict[str, Any]:
        return {"config": dict(self.config), "goodput_tok_s": self.goodput_tok_s,
                "constraints": dict(zip(self.constraint_names, self.constraints,
                                        strict=True)) if self.constraint_names
                else list(self.constraints),
                "feasible": self.feasible, "summary": dict(self.summary)}


def _figure(summary: Mapping[str, Any], where: str, key: str) -> float:
    if key not in summary:
        raise SummaryError(f"summary{where} lacks {key!r}; pass a DESIGN §8 summary "
                           "(slopilot simulate --json) or an evaluator's")
    value = summary[key]
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SummaryError(f"summary{where}[{key!r}]={value!r}: expected a number")
    return float(value)


def _term(measured: float, limit: float) -> float:
    return NO_SAMPLES if math.isnan(measured) else measured / limit - 1.0


def score(summary: Mapping[str, Any], slo: SLOSpec,
          config: Mapping[str, Any] | None = None) -> TrialResult:
    """Goodput and normalized SLO constraints of one run's summary.

    ``config`` defaults to ``summary["config"]`` (the simulator records it there).
    """
    classes = summary.get("classes")
    if not isinstance(classes, Mapping):
        raise SummaryError("summary lacks 'classes' (per-class figures under p0, p1, p2)")
    constraints: list[float] = []
    for p, c in slo.classes().items():
        per = classes.get(p.label)
        if not isinstance(per, Mapping):
            raise SummaryError(f"summary['classes'] lacks {p.label!r}")
        where = f"['classes'][{p.label!r}]"
        if c.ttft_p99_ms is not None:
            constraints.append(_term(_figure(per, where, "ttft_p99_ms"), c.ttft_p99_ms))
        if c.tbt_p99_ms is not None:
            constraints.append(_term(_figure(per, where, "tbt_p99_ms"), c.tbt_p99_ms))
    limit = slo.max_preemptions_per_min
    if limit is not None:
        rate = _figure(summary, "", "preemptions_per_min")
        constraints.append(_term(rate, limit))
    goodput = _figure(summary, "", "goodput_tok_s")
    if not math.isfinite(goodput):
        goodput = 0.0
    if config is None:
        config = summary.get("config") or {}
    return TrialResult(config=dict(config), goodput_tok_s=goodput,
                       constraints=tuple(constraints),
                       feasible=all(c <= 0.0 for c in constraints),
                       summary=dict(summary), constraint_names=constraint_names(slo))

