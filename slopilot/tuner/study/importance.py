"""Knob importance, only where it means something, in the knobs' user names.

Optuna's fANOVA attributes the variation of a target to the sampled parameters. Left to
itself it ranks knobs that provably changed nothing (the preemption knobs in a run with
no preemption) and names the space's encodings (``token_budget/256``). So:

- the target is what decided the study: the worst SLO term while it varies (feasibility
  is what the knobs bought), else the objective; neither varying, there is nothing to
  attribute and no plot;
- knobs that could not have acted are left out and said so: the preemption knobs when no
  trial preempted, ``p0_preempt_utilization`` without P0 traffic, ``kv_watermark`` when
  the KV cache never came near the highest watermark;
- the budget's multiple of its alignment (``token_budget/256``) and ``chunk_fraction``
  are shown as ``token_budget`` and ``chunk_size`` (``space.user_name``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.bounds import DEFAULT_BOUNDS, FloatRange
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import user_name

MIN_TRIALS = 8
PREEMPTION_KNOBS = ("preemption_mode", "recompute_max_tokens", "max_preemptions_per_step",
                    "swap_timeout_ms")
_TERM_SPREAD = 0.05   # the worst term moves by 5 % of its limit across trials
_VALUE_SPREAD = 0.005  # the objective by 0.5 % of itself


@dataclass(frozen=True)
class Importance:
    values: dict[str, float] | None
    """User knob name -> share; None when left out (``reason`` says why)."""
    target: str
    reason: str
    """Why it is left out, or which knobs were and why."""


def _summaries(result: TrialResult) -> list[WindowSummary]:
    found = [w.result.summary for w in result.windows if w.result.summary is not None]
    return found or ([result.summary] if result.summary is not None else [])


def inert_knobs(results: Sequence[TrialResult]) -> dict[str, str]:
    """Knobs that could not have changed these trials, with the reason."""
    summaries = [s for r in results for s in _summaries(r)]
    if not summaries:
        return {}
    out: dict[str, str] = {}
    if all(s.preemptions_per_min == 0 for s in summaries):
        out.update({k: "no trial preempted" for k in PREEMPTION_KNOBS})
    if all(s.classes[Priority.P0].requests_finished == 0 for s in summaries):
        out["p0_preempt_utilization"] = "no P0 traffic"
    watermark = DEFAULT_BOUNDS["kv_watermark"]
    top = watermark.hi if isinstance(watermark, FloatRange) else 0.5
    if all(s.engine is not None and s.engine.kv_usage_max < 1.0 - top for s in summaries):
        out["kv_watermark"] = f"the KV cache stayed below {1 - top:.0%} full"
    return out


def importance(study: optuna.Study, results: Sequence[TrialResult]) -> Importance:
    complete = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE and "constraints" in t.user_attrs]
    # The trials of the latest encoding of the space: a study resumed in another (an
    # earlier slopilot's budget rank, another budget_align) has two parameters for one
    # knob, whose shares would overwrite each other under the knob's name.
    latest = set(complete[-1].params) if complete else set()
    complete = [t for t in complete if set(t.params) == latest]
    if len(complete) < MIN_TRIALS:
        return Importance(None, "", f"needs at least {MIN_TRIALS} completed trials "
                          f"({len(complete)} here)")
    worst = [max(t.user_attrs["constraints"], default=0.0) for t in complete]
    values = [float(t.value) for t in complete if t.value is not None]
    if max(worst) - min(worst) >= _TERM_SPREAD:
        target_name = "the worst SLO term"

        def target(t: optuna.trial.FrozenTrial) -> float:
            return float(max(t.user_attrs["constraints"], default=0.0))
    elif values and max(values) - min(values) >= _VALUE_SPREAD * max(abs(max(values)), 1e-9):
        target_name = "the objective"

        def target(t: optuna.trial.FrozenTrial) -> float:
            return float(t.value if t.value is not None else 0.0)
    else:
        return Importance(None, "", "no knob changed the SLO terms or the objective "
                          "measurably in these trials: there is nothing to attribute")
    inert = inert_knobs(results)
    params = sorted({p for t in complete for p in t.params})
    kept = [p for p in params if user_name(p) not in inert
            and len({repr(t.params.get(p)) for t in complete}) > 1]
    if not kept:
        return Importance(None, target_name, "no varied knob could have acted")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            raw = optuna.importance.get_param_importances(study, params=kept, target=target)
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return Importance(None, target_name, f"Optuna could not attribute it ({exc})")
    left_out = sorted({f"{k} ({why})" for k, why in inert.items() if k in
                       {user_name(p) for p in params}})
    reason = ("left out, as they could not have acted: " + ", ".join(left_out)) \
        if left_out else ""
    return Importance({user_name(k): float(v) for k, v in raw.items()},
                      target_name, reason)
