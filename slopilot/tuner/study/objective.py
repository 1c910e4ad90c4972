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

from slopilot.engine.slo import SLOSpec, slo_term, term_holds
from slopilot.engine.window_summary import WindowSummary

# A class that served nothing in the window has no P99 (None in a summary); it breaks no
# SLO (its goodput is zero, which the objective already counts), so its term reads as
# comfortably met. That is right for a class the workload does not send (a trace without
# P0 traffic), not for one it sends and the window happened to miss: a live trial asks
# ``unmeasured`` first (tuner/loop/trial_window.py), and a window that did not measure the
# class its episode is about is no verdict.
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


HEADROOM = 0.1
"""The headroom a config needs before it counts as holding the SLO: every term at most
90 % of its limit. The simulator is an instrument, not the plant: scheduling jitter and a
cost model a little off push a config tuned to the SLO's edge over it. The offline study
(``slopilot tune``), the loop's warm start (``SimOffline``) and its scale-up plan use it."""

OBJECTIVE_VERSION = 1
"""How a trial's value and constraint terms are computed from a window (``score``, the
worst-window rule): raise it when that changes, so that a stored ``slopilot tune`` study
made under the old rule is not resumed and ranked with trials scored by the new one
(``tune/study_record.py``)."""


@dataclass(frozen=True)
class WindowResult:
    """A config's result on one of the windows a robust verdict judges it on."""

    name: str
    """``busiest arrivals``, ``typical``, ``seed 1`` ... (``windows.WindowChoice``)."""
    span: str
    """Where the window lies, for a person (``WindowChoice.describe``)."""
    result: TrialResult


@dataclass(frozen=True)
class TrialResult:
    """One evaluated configuration."""

    config: Mapping[str, Any]
    goodput_tok_s: float
    constraints: tuple[float, ...]
    """``measured / limit - 1`` per SLO term (with several windows, the worst window's)."""
    feasible: bool
    """Every term at most ``-margin``: ``holds(self, self.margin)``."""
    summary: WindowSummary | None = None
    """What was measured (with several windows, the deciding one's); None for a stored
    trial whose summary could not be read."""
    constraint_names: tuple[str, ...] = ()
    margin: float = 0.0
    """The headroom feasibility asked for (``HEADROOM`` for ``slopilot tune``)."""
    objective: float | None = None
    """What the study maximizes when not ``goodput_tok_s`` (the worst window's goodput
    share, for a robust verdict)."""
    windows: tuple[WindowResult, ...] = ()
    """Each window's own result (a robust verdict); empty for one window."""

    @property
    def value(self) -> float:
        """The study's objective value."""
        return self.goodput_tok_s if self.objective is None else self.objective

    @property
    def optuna_constraints(self) -> tuple[float, ...]:
        """Optuna's form, feasible when every value is <= 0: the terms shifted by the
        headroom, so Optuna's feasibility is ``feasible``."""
        return tuple(c + self.margin for c in self.constraints)

    @property
    def violation(self) -> float:
        """How far from holding (with the headroom): 0 when feasible, larger when worse."""
        return sum(max(0.0, c) for c in self.optuna_constraints)

    def to_dict(self) -> dict[str, Any]:
        out = {"config": dict(self.config), "goodput_tok_s": self.goodput_tok_s,
               "constraints": dict(zip(self.constraint_names, self.constraints,
                                       strict=True)) if self.constraint_names
               else list(self.constraints),
               "feasible": self.feasible,
               "summary": None if self.summary is None else self.summary.to_dict()}
        if self.margin:
            out["margin"] = self.margin
        if self.objective is not None:
            out["objective"] = self.objective
        if self.windows:
            out["windows"] = [{"name": w.name, "span": w.span, **w.result.to_dict()}
                              for w in self.windows]
        return out


def _term(measured: float | None, limit: float) -> float:
    return NO_SAMPLES if measured is None else slo_term(measured, limit)


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


def unmeasured(summary: WindowSummary, slo: SLOSpec) -> tuple[str, ...]:
    """Labels of the classes with an SLO term of which ``summary`` has no sample: every
    P99 their SLO sets is None (``score`` reads those terms as ``NO_SAMPLES``)."""
    out: list[str] = []
    for p, c in slo.classes().items():
        figures = summary.classes[p]
        set_by_slo = [value for value, limit in ((figures.ttft_p99_ms, c.ttft_p99_ms),
                                                 (figures.tbt_p99_ms, c.tbt_p99_ms))
                      if limit is not None]
        if set_by_slo and all(value is None for value in set_by_slo):
            out.append(p.label)
    return tuple(out)


def holds(result: TrialResult, margin: float) -> bool:
    """Feasible with every constraint term at most ``-margin`` (headroom)."""
    return all(term_holds(c, margin) for c in result.constraints)
