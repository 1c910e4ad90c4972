"""One ``slopilot tune`` run: the windows, the start config, the study, the verdict, the
capacity answer, the report; ``main`` is the command's handler."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.output_paths import make_output_dir
from slopilot.engine.sim.too_long import TooLong
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.loop.settings import DEFAULT_CLASS_REQUESTS
from slopilot.tuner.sim.robust import RobustEvaluator, WindowPlan, plan_windows
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.sample_floor import shortfall
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import (
    Violation,
    infeasible_sentence,
    replicas_text,
    violations,
)
from slopilot.tuner.tune.capacity import CapacityOutcome, capacity_answer
from slopilot.tuner.tune.idle_floor import FloorBook, up_front
from slopilot.tuner.tune.outcome import (
    Candidate,
    Timing,
    TuneOutcome,
    candidates,
    kept_clause,
    tie_clause,
)
from slopilot.tuner.tune.output import print_json, print_text
from slopilot.tuner.tune.progress import TuneProgress
from slopilot.tuner.tune.report import write
from slopilot.tuner.tune.settings import (
    TuneSettings,
    check_command,
    cut_warning,
    pace_warning,
    settings_from,
    thin_warning,
    trace_doubts,
    tune_command,
    warmup_warning,
)
from slopilot.tuner.tune.stop import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    stopped_note,
    stops_raise,
)
from slopilot.tuner.tune.study_record import check_or_record
from slopilot.tuner.tune.tense import JUDGED, Tense, When
from slopilot.tuner.tune.whole_check import WholeCheck, whole_check


def main(args: argparse.Namespace) -> int:
    with stops_raise():
        try:
            return _main(args)
        except KeyboardInterrupt:  # said by run(), with the best trial so far
            return EXIT_INTERRUPTED
        except Terminated:
            return EXIT_TERMINATED


def _main(args: argparse.Namespace) -> int:
    from slopilot.engine.config import ConfigError
    from slopilot.engine.sim.cost_model import CostModelError
    from slopilot.engine.sim.profiles import ProfileError
    from slopilot.engine.sim.scenario import ScenarioError
    from slopilot.tuner.loop.capacity import CapacityError
    from slopilot.tuner.study.storage import StudyStorageError

    try:
        settings = settings_from(args)
        if settings.report_dir is not None:
            make_output_dir(settings.report_dir, "--report-dir")
        outcome = run(settings)
    except (ConfigError, ScenarioError, StudyStorageError, CapacityError, ProfileError,
            CostModelError, ValueError) as e:
        print(f"slopilot tune: {e}", file=sys.stderr)
        return 2
    report, failed = None, None
    if settings.report_dir is not None:
        try:
            report = write(outcome, settings.report_dir)
        except Exception as exc:  # the verdict is the study's result: never lost to it
            failed = (f"cannot write the report in {settings.report_dir}: {_why(exc)}; "
                      "the verdict is printed without it")
    if settings.json:
        print_json(outcome, report)
    else:
        print_text(outcome, report)
    if failed is not None:
        print(f"slopilot tune: {failed}", file=sys.stderr)
        return 1
    return 0


def _why(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        path = exc.filename2 or exc.filename
        return exc.strerror + ("" if path is None else f" ({path})")
    return f"{type(exc).__name__}: {exc}"


def run(s: TuneSettings) -> TuneOutcome:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    space, start_config = s.space, dict(s.start.config)
    plan = plan_windows(s.scenario, duration_s=s.duration_s, seeds=s.seeds,
                        warmup_s=s.warmup_s, whole=s.whole, config=start_config,
                        replicas=s.replicas)
    study = open_study(s.storage, s.study_name, sampler=s.sampler, seed=s.seed)
    # Before any trial: a resumed study's trials must have been run under these settings.
    too_long = s.too_long.text() if s.too_long is not None and s.too_long.warns else None
    thin = thin_warning(s, plan)
    # The start config's idle floor, said before the study where it binds: no trial can
    # then hold on any count (the capacity answer reads the same book).
    book = FloorBook(s.scenario, s.scenario.slo, plan)
    warnings = tuple(w for w in (too_long, cut_warning(s), warmup_warning(s, plan), thin,
                                 *trace_doubts(s), check_or_record(study, s, plan),
                                 up_front(book.of(start_config)))
                     if w is not None)
    for warning in warnings:
        # Before the study, and whatever --quiet says: it may be worth stopping for.
        print(f"slopilot tune: warning: {warning}", file=sys.stderr)
    tuner = Tuner(study, space)
    first = len(study.get_trials(deepcopy=False))
    generated = not isinstance(s.scenario.workload, TraceSpec)
    # The whole-trace check's first replay, where the windows will choose the answer:
    # counted in the bar from the start (its later ones depend on what it finds).
    checked = plan.kind == "trace" and not _too_many_too_long(s)
    progress = TuneProgress(s.trials + 1, plan.simulated_s, trials=s.trials,
                            generated=generated, enabled=not s.quiet,
                            whole_s=_whole_plan(s, start_config).simulated_s if checked
                            else 0.0)
    evaluator = RobustEvaluator(s.scenario, plan, replicas=s.replicas,
                                progress=progress.simulated)
    progress.note(f"tuning {s.scenario.name} on {replicas_text(s.replicas)}, {s.trials} trials, "
                  f"each {plan.describe()}")
    stopped: BaseException | None = None
    start_done = False
    try:
        start = evaluator.evaluate(start_config)
        start_done = True
        if (pace := pace_warning(s, evaluator.pace)) is not None:
            # Once the start config has been replayed, where the count is known: a
            # verdict on traffic no chat client makes may be worth stopping for.
            warnings = (*warnings, pace)
            progress.warn(f"slopilot tune: warning: {pace}")
        progress.started()
        tuner.run(evaluator, s.trials, callback=progress.trial_done)
        timing = Timing(evaluations=s.trials + 1, simulated_s=evaluator.simulated_s,
                        study_s=time.perf_counter() - t0)
        ranked = candidates(start, tuner.results())
        best = ranked[0]
        capacity = None
        if not best.result.feasible and s.max_replicas > s.replicas:
            progress.note(infeasible_sentence(best.result, evaluator.slo, s.replicas))
            # The two closest trials and the start config, closest first.
            closest = [c.trial for c in ranked if not c.is_start][:2]
            capacity = capacity_answer(
                evaluator, [(c.label, c.result.config) for c in ranked
                            if c.is_start or c.trial in closest],
                s.replicas + 1, s.max_replicas, note=progress.note, progress=progress,
                book=book)
        whole = _whole_check(s, evaluator, plan, best, capacity, start_config, progress)
    except (KeyboardInterrupt, Terminated) as exc:
        stopped = exc  # the open trial was told failed (Tuner.run)
        raise
    finally:
        progress.close()
        if stopped is not None:
            print(stopped_note(stopped, s, tuner, first=first, start_done=start_done),
                  file=sys.stderr)
    timing = dataclasses.replace(timing, total_s=time.perf_counter() - t0)
    outcome = _outcome(s, plan, tuner, start, best, capacity, evaluator, timing, whole)
    few = few_requests(best.result, plan, evaluator.slo)
    # The verdict names a thin replay's span and rate too: its few requests are then the
    # trace's pace, not a window's bad luck (a trace of milliseconds read as seconds).
    said = " ".join(n for n in (few, thin and f"{thin[:1].upper()}{thin[1:]}.") if n)
    if not said:
        return dataclasses.replace(outcome, warnings=warnings)
    return dataclasses.replace(outcome, sentence=f"{outcome.sentence} {said}",
                               warnings=(*warnings, *((few,) if few else ())))


def few_requests(result: TrialResult, plan: WindowPlan, slo: SLOSpec) -> str | None:
    """Where a window judged a class on fewer requests than the live loop judges a
    trial on (``min_class_requests``' default), how few, in ``sample_floor``'s words
    (the window with the fewest); None where every window holds enough."""
    shorts = [short for w, choice in zip(result.windows, plan.windows, strict=False)
              if w.result.summary is not None
              and (short := shortfall(w.result.summary, slo, DEFAULT_CLASS_REQUESTS,
                                      choice.length_s)) is not None]
    if not shorts:
        return None
    few = min(shorts, key=lambda s: s.requests)
    return (f"Judged on few requests: {few.had()}, fewer than the {few.floor} the live "
            "loop judges a class on (min_class_requests), so its P99 is the largest of them "
            "or near it.")


def _whole_check(s: TuneSettings, evaluator: RobustEvaluator, plan: WindowPlan,
                 best: Candidate, capacity: CapacityOutcome | None,
                 start_config: Mapping[str, Any], progress: TuneProgress
                 ) -> WholeCheck | None:
    """The answer replayed over the whole trace (``whole_check.py``), where windows
    chose it; None where nothing is recommended, or the plan judged the trace whole or a
    generated workload's seeds (each judged whole already)."""
    if plan.kind != "trace" or _too_many_too_long(s):
        return None  # too many too long: nothing is recommended, whatever it finds
    if best.result.feasible:
        config, replicas = best.result.config, s.replicas
    elif capacity is not None and capacity.replicas is not None:
        config, replicas = capacity.config, capacity.replicas
    else:
        return None
    whole = _whole_plan(s, start_config)
    progress.whole_check_begins()
    return whole_check(evaluator, whole, config, replicas, s.max_replicas,
                       note=progress.note, window_s=plan.windows[0].length_s,
                       progress=progress)


def _whole_plan(s: TuneSettings, start_config: Mapping[str, Any]) -> WindowPlan:
    return plan_windows(s.scenario, whole=True, warmup_s=s.warmup_s, config=start_config,
                        replicas=s.replicas)


def _share(r: TrialResult) -> str:
    return f"{max(r.constraints, default=-1.0) + 1:.0%}"


def _kept(start: TrialResult, best_trial: tuple[int, TrialResult] | None,
          tense: Tense = JUDGED) -> str:
    """Why no trial replaces the start config, in the verdict's words (``kept_clause``,
    its tense's "holds" where no trial did)."""
    if best_trial is not None and not best_trial[1].feasible:
        return f"no trial {tense.verb('holds', 'held')} it"
    return kept_clause(start, best_trial)


def _tense(s: TuneSettings, whole: WholeCheck | None) -> Tense:
    """The tense the verdict's builders say the study's findings in: refused where too
    many requests are too long; the windows' past where the whole trace missed where they
    held ("holds" is the whole trace's to say); "holds" said of the requests that fit,
    never bare, where some are rejected unjudged (a user would not call turning most of
    the load away holding the SLO); the start config kept only where something is
    recommended."""
    too_long = s.too_long
    if too_long is not None and _too_many_too_long(s):
        return Tense(When.REFUSED, keep=False)
    served = too_long.of - too_long.requests if too_long is not None and too_long.warns \
        else None
    if whole is None:
        return Tense(served=served)
    return Tense(When.JUDGED if whole.first.holds else When.WINDOWS, served,
                 keep=whole.replicas is not None)


def _too_many_too_long(s: TuneSettings) -> bool:
    """More of the trace's requests too long for one replica than ``--max-too-long``: the
    SLO does not hold, whatever the study finds on the rest."""
    return s.too_long is not None and s.too_long.exceeds(s.max_too_long)


def _refused(sentence: str, too_long: TooLong, max_share: float) -> str:
    """The verdict where too many requests are too long: it does not hold, nothing is
    recommended, and what the study found (``sentence``, built in the past tense:
    ``When.REFUSED``) is said of the requests that fit."""
    limit = too_long.limit
    # The smallest share, to the percent, that would accept them (round first: 0.9 * 100
    # is 90.00000000000001).
    accepts = math.ceil(round(too_long.share * 100, 9)) / 100
    lead = (f"{too_long.rejected()}, more than the {max_share * 100:g}% --max-too-long "
            "allows: the SLO does not hold whatever the knobs, and more replicas serve "
            "none of them (a request too long for one replica is too long for each), so "
            f"nothing is recommended; {limit.fix()}, cut such requests from the trace, or "
            f"give --max-too-long {accepts:g} to accept them.")
    served = too_long.of - too_long.requests
    return f"{lead} What the study found on the {served:,} requests that fit: {sentence}"


def _outcome(s: TuneSettings, plan: WindowPlan, tuner: Tuner, start: TrialResult,
             best: Candidate, capacity: CapacityOutcome | None,
             evaluator: RobustEvaluator, timing: Timing,
             whole: WholeCheck | None = None) -> TuneOutcome:
    slo = evaluator.slo
    missed: tuple[Violation, ...] = ()
    replicas: int | None = s.replicas
    config: Mapping[str, Any] | None = None
    best_trial = tuner.best_trial()
    on = f"on {replicas_text(s.replicas)}"
    result = best.result
    tense = _tense(s, whole)
    holds = f"{tense.hold(singular=True)} the SLO {tense.every_window()}"
    if result.feasible and best.is_start:
        config = result.config
        sentence = (f"The start config {holds} with "
                    f"{result.margin:.0%} headroom {on} (its closest term at "
                    f"{_share(result)} of its limit) and {_kept(result, best_trial, tense)}"
                    f"{tense.kept()}")
    elif result.feasible:
        config = result.config
        sentence = (f"Trial {best.trial} {holds} with "
                    f"{result.margin:.0%} headroom {on}; its closest term is at "
                    f"{_share(result)} of its limit.")
        if (tie := tie_clause(result, start)) is not None:
            sentence += f" {tie}"
    else:
        missed = tuple(violations(result, slo))
        sentence = infeasible_sentence(result, slo, s.replicas, past=tense.past)
        replicas = None if capacity is None else capacity.replicas
        config = capacity.config if capacity is not None and replicas is not None else None
        if capacity is not None:
            sentence += " " + capacity.sentence(tense)
        elif s.max_replicas <= s.replicas:
            sentence += (f" No capacity search: --max-replicas {s.max_replicas} is not above "
                         f"{s.replicas}.")
    if whole is not None and replicas is not None:
        windows_replicas, replicas = replicas, whole.replicas
        if replicas is None:
            config = None  # nothing is recommended (nor kept: ``_tense``)
        sentence += " " + whole.clause(windows_replicas)
    if s.too_long is not None and _too_many_too_long(s):
        sentence = _refused(sentence, s.too_long, s.max_too_long)
        replicas, config = None, None
    elif s.too_long is not None and s.too_long.warns:
        # Led by the requests it does not judge ("holds" is said of the rest: ``_tense``).
        sentence = f"{s.too_long.clause()} {sentence}"
    changes = None if config is None else {
        k: v for k, v in config.items() if start.config.get(k) != v}
    check = None if config is None or replicas is None else check_command(s, config, replicas)
    return TuneOutcome(
        settings=s, plan=plan, tuner=tuner, start=start, best=best, best_trial=best_trial,
        violations=missed, sentence=sentence, capacity=capacity,
        recommended_replicas=replicas, config=config, changes=changes,
        command=tune_command(s), check_command=check, timing=timing, whole=whole)
