"""A trial's record read back: why a failed trial failed, a completed trial's result and
each of its windows' as ``Tuner.tell`` stored them in user attributes, and the order of
results (``rank``). A study read back needs neither the space's encoding nor the process
that ran it.
"""

from __future__ import annotations

import logging
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from slopilot.engine.window_summary import SummaryError, WindowSummary
from slopilot.tuner.study.heartbeat import STALE_REASON
from slopilot.tuner.study.objective import TrialResult, WindowResult

log = logging.getLogger(__name__)


def _constraints(trial: FrozenTrial) -> list[float]:
    return [float(c) for c in trial.user_attrs.get("constraints", ())]


def failure_reason(trial: FrozenTrial) -> str | None:
    """Why a FAIL trial failed: as told, or stale (failed when its process stopped
    beating: Optuna fails it first, so nothing can be stored on it); None otherwise."""
    if trial.state != TrialState.FAIL:
        return None
    return str(trial.user_attrs.get("fail_reason", STALE_REASON))


def result_of(trial: FrozenTrial) -> TrialResult | None:
    """A completed trial's result as stored; None for any other state."""
    if trial.state != TrialState.COMPLETE or "goodput_tok_s" not in trial.user_attrs:
        return None
    a = trial.user_attrs
    return TrialResult(config=dict(a.get("config", {})), goodput_tok_s=float(a["goodput_tok_s"]),
                       constraints=tuple(_constraints(trial)), feasible=bool(a["feasible"]),
                       summary=_stored_summary(trial, a.get("summary")),
                       constraint_names=tuple(a.get("constraint_names", ())),
                       margin=float(a.get("margin", 0.0)),
                       objective=None if a.get("objective") is None else float(a["objective"]),
                       windows=_stored_windows(trial))


def _stored_windows(trial: FrozenTrial) -> tuple[WindowResult, ...]:
    """Each window's result as ``Tuner.tell`` stored it (a robust verdict's)."""
    out = []
    for w in trial.user_attrs.get("windows", ()):
        out.append(WindowResult(str(w["name"]), str(w["span"]), TrialResult(
            config=dict(trial.user_attrs.get("config", {})),
            goodput_tok_s=float(w["goodput_tok_s"]),
            constraints=tuple(float(c) for c in w["constraints"]),
            feasible=bool(w["feasible"]), summary=_stored_summary(trial, w.get("summary")),
            constraint_names=tuple(trial.user_attrs.get("constraint_names", ())))))
    return tuple(out)


def _stored_summary(trial: FrozenTrial, stored: Any) -> WindowSummary | None:
    """A summary the trial stored, by this version or an earlier one (a dict form
    ``WindowSummary.from_dict`` reads); None, and a warning, when it cannot be read."""
    if stored is None:
        return None
    try:
        return WindowSummary.from_dict(stored)
    except SummaryError as exc:
        log.warning("trial %d: its stored summary is unreadable (%s); kept without it",
                    trial.number, exc)
        return None


def rank(result: TrialResult) -> tuple[int, float, float]:
    """Sort key, larger is better: feasible before infeasible; then a higher objective
    (goodput; ties go to the config with more headroom); among infeasible ones, less
    violation."""
    if result.feasible:
        return (1, result.value, -max(result.constraints, default=0.0))
    return (0, -result.violation, result.value)
