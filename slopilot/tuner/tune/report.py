"""``slopilot tune --report-dir``: the study's report with what the tune knows besides
the trials (the windows, the verdict, the capacity answer, the commands)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.plot_subject import PlotSubject
from slopilot.tuner.study.report import ReportContext, write_report
from slopilot.tuner.tune.outcome import TuneOutcome


def context(outcome: TuneOutcome) -> ReportContext:
    cap = outcome.capacity
    capacity = [] if cap is None else cap.table_lines()
    config = None
    if outcome.config is not None:
        config = {k: v for k, v in outcome.config.items() if k in outcome.tuner.space.bounds}
    return ReportContext(
        verdict=outcome.sentence, judged_on=outcome.plan.describe(),
        windows=[dataclasses.asdict(w) for w in outcome.plan.windows],
        replicas=outcome.settings.replicas,
        recommended_replicas=outcome.recommended_replicas, recommended_config=config,
        capacity=capacity, command=outcome.command, check_command=outcome.check_command,
        timing=outcome.timing.line(),
        recommended_result=_recommended_result(outcome),
        recommended_note=_kept(outcome),
        extra=tuple(line for note in _notes(outcome) for line in ("", note)))


def _recommended_result(outcome: TuneOutcome) -> TrialResult | None:
    """The recommendation's figures where the best trial's are not them."""
    cap = outcome.capacity
    if cap is not None and cap.replicas is not None:
        return cap.tried[cap.replicas]
    return outcome.start if outcome.best.is_start and outcome.feasible else None


def _kept(outcome: TuneOutcome) -> str | None:
    if outcome.changes != {}:
        return None
    if outcome.recommended_replicas == outcome.settings.replicas:
        return "Keep the start config: no knob changes."
    return "The start config's knobs, on more replicas: no knob changes."


def _notes(outcome: TuneOutcome) -> list[str]:
    fitted = outcome.settings.start.note()
    notes = [] if fitted is None else [fitted[:1].upper() + fitted[1:] + "."]
    return notes + [f"Warning: {w}" for w in outcome.warnings]


def write(outcome: TuneOutcome, out_dir: Path) -> Path:
    scenario = outcome.settings.scenario
    return write_report(outcome.tuner, scenario.slo, out_dir, start=outcome.start,
                        subject=PlotSubject.of(scenario, run=outcome.command),
                        title=f"Tuning {scenario.name}", context=context(outcome))
