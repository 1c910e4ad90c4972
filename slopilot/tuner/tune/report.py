"""``slopilot tune --report-dir``: the study's report with what the tune knows besides
the trials (the windows, the verdict, the capacity answer, the commands)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.plot_subject import PlotSubject
from slopilot.tuner.study.report import ReportContext, write_report
from slopilot.tuner.study.verdict import replicas_text, term_label, worst_share
from slopilot.tuner.tune.capacity import CapacityOutcome
from slopilot.tuner.tune.comparison import comparison
from slopilot.tuner.tune.outcome import Candidate, TuneOutcome
from slopilot.tuner.tune.settings import check_command
from slopilot.tuner.tune.whole_check import WholeCheck


def context(outcome: TuneOutcome) -> ReportContext:
    cap = outcome.capacity
    capacity = [] if cap is None else _capacity_lines(outcome, cap)
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
        recommended_note=_kept(outcome), recommended_label=_recommended_label(outcome),
        best=(outcome.best.label, outcome.best.result), best_trial=outcome.best.trial,
        comparison=() if (table := comparison(outcome)) is None else table.markdown(),
        extra=tuple(line for note in _notes(outcome) for line in ("", note)))


def _capacity_lines(outcome: TuneOutcome, cap: CapacityOutcome) -> list[str]:
    """The capacity search's table with the study's own count first: the search begins
    one above it, and the table left out the result that sent it there (rep_b3: the start
    config at 97 % of a limit on 1 replica, beside only the 2-replica row)."""
    tuned = _candidate_result(outcome, cap.label)
    if tuned is None or outcome.settings.replicas in cap.tried:
        lines = cap.table_lines()
    else:
        lines = dataclasses.replace(
            cap, tried={outcome.settings.replicas: tuned, **cap.tried}).table_lines()
        # The sentence is the search's own (which counts it tried), not the table's.
        lines = [cap.sentence(), *lines[1:]]
    return lines + _verdicts_closest(outcome, cap) + _one_fewer(outcome, cap)


def _verdicts_closest(outcome: TuneOutcome, cap: CapacityOutcome) -> list[str]:
    """Where the verdict's closest config on the count tuned at is another than the
    table's candidate, both named: tiny-cpu's verdict read trial 24's P0 TTFT p99 at 140 %
    on 1 replica, and the table "the start config's, the candidate closest to holding"
    read 275 % (P0 TBT p99) on that same count."""
    best, n = outcome.best, outcome.settings.replicas
    if best.label == cap.label or best.result.feasible:
        return []
    share, name = worst_share(best.result)
    term = "its worst term" if name is None else term_label(name)[0]
    row = (f"; the table's row for {n} is {cap.label}'s"
           if _candidate_result(outcome, cap.label) is not None or n in cap.tried else "")
    return ["", f"On {replicas_text(n)}, the count tuned at, the verdict's "
                f"closest config is {best.label} ({term} at {share} of its limit){row}."]


def _one_fewer(outcome: TuneOutcome, cap: CapacityOutcome) -> list[str]:
    """The check of the count below the answer, and why it may hold there: a reviewer
    ran ``simulate --replicas 10`` and read 80 % of the limit where tune's windows read
    90 %, and the report had no word on which to believe."""
    n = cap.replicas
    if n is None or n < 2 or outcome.recommended_replicas != n \
            or outcome.check_command is None:
        return []
    lines = ["", f"To replay one replica fewer ({n - 1}) as the check below does:", "",
             "```", check_command(outcome.settings, cap.config, n - 1), "```"]
    if outcome.plan.kind != "trace":
        return lines
    return lines + [
        "", "`slopilot simulate` replays the whole trace as one run, its P99 over every "
        "request in it; tune judged each window on its own (the table's last column names "
        "the window that decided each count), and one busy window's P99 over its few "
        "hundred requests reads higher than the whole trace's. So this replay may hold on "
        f"{n - 1} where the windows did not: the answer is the windows', which the whole "
        "trace must hold as well (the verdict above)."]


def _candidate_result(outcome: TuneOutcome, label: str) -> TrialResult | None:
    """The capacity candidate ``label``'s result on the replicas the study ran on."""
    if label == Candidate(outcome.start).label:
        return outcome.start
    return next((r for n, r in outcome.tuner.results() if Candidate(r, n).label == label),
                None)


def _recommended_result(outcome: TuneOutcome) -> TrialResult | None:
    """The recommendation's figures where the best trial's are not them."""
    cap = outcome.capacity
    if cap is not None and cap.replicas is not None:
        # The whole trace may have asked for more than the windows' count: these are
        # the figures of the count the windows found, not of the one recommended.
        return cap.tried[cap.replicas] if outcome.recommended_replicas == cap.replicas \
            else None
    return outcome.start if outcome.best.is_start and outcome.feasible else None


def _recommended_label(outcome: TuneOutcome) -> str | None:
    """Whose knobs ``_recommended_result``'s figures are."""
    cap = outcome.capacity
    if cap is not None and cap.replicas is not None:
        return cap.label
    return outcome.best.label


def _kept(outcome: TuneOutcome) -> str | None:
    if outcome.changes != {}:
        return None
    if outcome.recommended_replicas == outcome.settings.replicas:
        return "Keep the start config: no knob changes."
    return "The start config's knobs, on more replicas: no knob changes."


def _notes(outcome: TuneOutcome) -> list[str]:
    fitted = outcome.settings.start.note()
    notes = [] if fitted is None else [fitted[:1].upper() + fitted[1:] + "."]
    whole = outcome.whole
    if whole is not None and not whole.holds:
        # The plots colour each config by its windows; the verdict is the whole trace's.
        notes.append(_whole_missed(outcome, whole))
    return notes + [f"Warning: {w}" for w in outcome.warnings]


def _whole_missed(outcome: TuneOutcome, whole: WholeCheck) -> str:
    """Where no count replayed holds the whole trace, what was replayed and searched: it
    said "missed over the whole trace on every count up to --max-replicas 8" where the
    replays began at the windows' count and bisected, some counts held while the next
    missed, the config was drawn missing on the count tuned at, and the capacity search's
    other candidates were searched in the windows only, below its answer."""
    cap, n, tuned = outcome.capacity, whole.first.replicas, outcome.settings.replicas
    answered = cap is not None and cap.replicas is not None
    label = cap.label if cap is not None and answered else outcome.best.label
    who = (f"{label}, drawn as holding the SLO there on {replicas_text(n)}" if n == tuned
           else f"{label}, which held in the windows on {replicas_text(n)} (the plots draw "
                f"{replicas_text(tuned)}, where none held)")
    counts = sorted(r.replicas for r in whole.runs)
    span = (f"{replicas_text(counts[0])}" if len(counts) == 1 else
            f"{counts[0]} to {counts[-1]} replicas")
    replayed = (f"{span} ({', '.join(map(str, counts))}; --max-replicas "
                f"{whole.max_replicas})")
    if whole.lucky:
        pairs = "; ".join(f"{k} held but {k + 1} missed" for k in whole.lucky)
        said = (f"{who}, was replayed over the whole trace on {replayed}: {pairs}, and no "
                "count held with the count above it holding too")
    else:
        said = f"{who}, missed over the whole trace on each count replayed, {replayed}"
    lines = [f"The plots judge each config in the study's windows only: {said} (the "
             "verdict above)."]
    if cap is not None and answered:
        tops: dict[str, int] = {}
        for other, k, _, _ in cap.searched:
            if other != cap.label:
                tops[other] = max(k, tops.get(other, k))
        for other, k in tops.items():
            below = f" (below {n}, the best count so far)" if k < n else ""
            lines.append(f"{other[:1].upper()}{other[1:]} was searched in the windows only, "
                         f"up to {replicas_text(k)}{below}, and not replayed over the whole "
                         "trace.")
    return " ".join(lines)


def write(outcome: TuneOutcome, out_dir: Path) -> Path:
    scenario = outcome.settings.scenario
    return write_report(outcome.tuner, scenario.slo, out_dir, start=outcome.start,
                        subject=PlotSubject.of(scenario, run=outcome.command,
                                               replicas=outcome.settings.replicas),
                        title=f"Tuning {scenario.name}", context=context(outcome))
