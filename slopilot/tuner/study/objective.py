"""The objective: goodput to maximize, SLO terms as Optuna constraints.

A ``WindowSummary`` (``engine/window_summary.py``: the simulator's, or a live window's)
becomes a ``TrialResult``. Each SLO term becomes one constraint ``measured / limit - 1``:
Optuna counts a trial feasible when every constraint is <= 0, and normalizing by the
limit makes terms of different units comparable (0.5 means 50 % over, whichever term).

Terms, in this fixed order: for each class p0, p1, p2, its TTFT P99 and then its TBT P99
where the SLO sets them; then the engine-wide preemptions per minute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary

# A class that served nothing in the window has no P99 (None in a summary); it breaks no
# SLO (its goodput is zero, which the objective already counts), so its term reads as
# comfortably met.
NO_SAMPLES = -1.0


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
    summary: WindowSummary | None = None
    """What was measured; None for a stored trial whose summary could not be read."""
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
                "feasible": self.feasible,
                "summary": None if self.summary is None else self.summary.to_dict()}


def _term(measured: float | None, limit: float) -> float:
    return NO_SAMPLES if measured is None else measured / limit - 1.0


def score(summary: WindowSummary, slo: SLOSpec,
          config: Mapping[str, Any] | None = None) -> TrialResult:
    """Goodput and normalized SLO constraints of one window's summary.

    ``config`` defaults to the simulated run's (``summary.run.config``).
    """
    constraints: list[float] = []
    for p, c in slo.classes().items():
        figures = summary.classes[p]
        if c.ttft_p99_ms is not None:
            constraints.append(_term(figures.ttft_p99_ms, c.ttft_p99_ms))
        if c.tbt_p99_ms is not None:
            constraints.append(_term(figures.tbt_p99_ms, c.tbt_p99_ms))
    limit = slo.max_preemptions_per_min
    if limit is not None:
        constraints.append(_term(summary.preemptions_per_min, limit))
    if config is None:
        config = summary.run.config if summary.run is not None else {}
    return TrialResult(config=dict(config), goodput_tok_s=summary.overall.goodput_tok_s,
                       constraints=tuple(constraints),
                       feasible=all(c <= 0.0 for c in constraints),
                       summary=summary, constraint_names=constraint_names(slo))


def holds(result: TrialResult, margin: float) -> bool:
    """Feasible with every constraint term at most ``-margin`` (headroom)."""
    return all(c <= -margin for c in result.constraints)
