"""The tune report's per-class table is the config the verdict names, named, the start
config included; its headings count replicas as a reader does; its plots say "worst
window" only where a config was judged on more than one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slopilot.tuner.study.objective import HEADROOM, TrialResult, WindowResult, score
from slopilot.tuner.study.report import caption, write_report
from slopilot.tuner.study.report_plots import history_figure, pareto_figure, terms_figure
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import robust_verdict
from slopilot.tuner.tune.outcome import Candidate
from slopilot.tuner.tune.report import context
from tests.support.summaries import figures, window
from tests.tuner.test_report import SLO, SUBJECT  # P0 300/60 ms, P1 1000/150 ms


def judged(p0_ttft: float, *windows: str) -> TrialResult:
    """A config judged on ``windows`` (each the same figures), P0 TTFT ``p0_ttft`` ms."""
    s = window({"p0": figures(p0_ttft, 30.0, 10.0), "p1": figures(400.0, 40.0, 100.0)})
    return robust_verdict({}, [WindowResult(w, f"{w}: 0-600 s", score(s, SLO))
                               for w in windows or ("whole trace",)], HEADROOM)


def study(p0_ttfts: list[float]) -> tuple[Tuner, list[tuple[int, TrialResult]]]:
    tuner = Tuner(open_study(None, "best", sampler="random", seed=1),
                  SearchSpace.from_bounds())
    for ttft in p0_ttfts:
        number, config = tuner.ask()
        tuner.tell(number, dataclasses.replace(judged(ttft), config=config))
    return tuner, tuner.results()


def outcome(best: Candidate, start: TrialResult, trials: list[tuple[int, TrialResult]],
            *, replicas: int = 1) -> Any:
    """What ``context`` reads of a ``TuneOutcome`` without a capacity search."""
    config = dict(best.result.config) if best.result.feasible else None
    return SimpleNamespace(
        capacity=None, config=config, sentence="The verdict ...",
        plan=SimpleNamespace(describe=lambda: "judged on the whole trace", windows=[],
                             kind="whole"),
        settings=SimpleNamespace(replicas=replicas, start=SimpleNamespace(note=lambda: None)),
        recommended_replicas=replicas if config is not None else None,
        command="slopilot tune --trace t.csv", check_command=None,
        timing=SimpleNamespace(line=lambda: "5 evaluations"), start=start, best=best,
        feasible=best.result.feasible, whole=None, best_trial=None,
        changes=None if config is None else {} if best.is_start else config,
        warnings=(), tuner=SimpleNamespace(results=lambda: trials,
                                           space=SimpleNamespace(bounds={})))


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_where_the_start_config_is_closest_the_table_is_its_and_says_so(
        tmp_path: Path) -> None:
    """rev-trace2 bursty: the verdict, the capacity table and the JSON named the start
    config (P0 TTFT p99 289 ms), while "The best trial, per window and class" showed
    trial 0 (324 ms): the trials were ranked without the start config."""
    tuner, trials = study([450.0, 500.0])
    start = judged(400.0)
    assert not start.feasible and not any(r.feasible for _, r in trials)
    ctx = context(outcome(Candidate(start), start, trials))
    text = write_report(tuner, SLO, tmp_path, start=start, context=ctx,
                        subject=SUBJECT).read_text()
    heading = "## The closest config on 1 replica (the start config), per window and class"
    assert heading in text, text
    assert "The best trial" not in text
    table = section(text, heading)
    assert "| 400 ms |" in table and "| 450 ms |" not in table, table
    top = section(text, "## Top 2 trials")
    assert "The start config is not a trial, so not in this table: no trial here ranks " \
        "above it (P0 TTFT p99 at 133% of its limit), and the verdict and the per-class " \
        "table above are its." in top, top


def test_where_a_trial_is_best_the_table_names_that_trial(tmp_path: Path) -> None:
    tuner, trials = study([250.0, 200.0])
    start = judged(400.0)
    n, best = trials[1]  # P0 TTFT 200 ms
    assert best.feasible
    # The run's result is another object than the one the report's tuner reads back:
    # matched by identity, the report said "Trial 1 is not a trial".
    ctx = context(outcome(Candidate(dataclasses.replace(best), n), start, trials, replicas=2))
    text = write_report(tuner, SLO, tmp_path, start=start, context=ctx,
                        subject=SUBJECT).read_text()
    heading = f"## The best config on 2 replicas (trial {n}), per window and class"
    assert heading in text, text
    assert "| 200 ms |" in section(text, heading)
    assert "The start config is not a trial" not in text


def test_one_replica_is_counted_in_the_singular(tmp_path: Path) -> None:
    """rep_d3's heading read "The recommendation on 1 replicas"; the knobs "1 replica(s)
    with"."""
    tuner, trials = study([450.0])
    start = judged(200.0)
    assert start.feasible
    ctx = context(outcome(Candidate(start), start, trials))
    assert ctx.recommended_result is start
    text = write_report(tuner, SLO, tmp_path, start=start, context=ctx,
                        subject=SUBJECT).read_text()
    assert "1 replicas" not in text and "replica(s)" not in text, text
    assert "1 replica with:" in text, text
    heading = "## The recommendation on 1 replica (the start config), per window and class"
    assert heading in text, text
    # The kept start config is the best config on the count tuned at: one table, not two.
    assert text.count("per window and class") == 1, text


def test_a_config_judged_on_one_window_is_not_said_to_have_a_worst_one(
        tmp_path: Path) -> None:
    """rev-trace2 diurnal (windows_kind whole): the plots' axes and titles read "worst
    window" of the one window, the whole trace."""
    def shared(r: TrialResult) -> TrialResult:  # a trace's windows count the output asked for
        return dataclasses.replace(r, objective=0.9)

    one = [(0, shared(judged(250.0))), (1, shared(judged(450.0)))]
    terms = terms_figure(one, SLO, subject=SUBJECT)
    assert terms is not None
    titles = [ax.get_title() for ax in terms.axes if ax.axison]
    assert titles and all("worst window" not in t and "(whole trace)" in t
                          for t in titles), titles
    for fig in (history_figure(one, subject=SUBJECT), pareto_figure(one, subject=SUBJECT)):
        assert fig.axes[0].get_ylabel() == "goodput share, whole trace"
    assert "worst window" not in caption("terms.png", one, None)
    assert "in the whole trace" in caption("terms.png", one, None)

    several = [(0, shared(judged(250.0, "w1", "w2"))), (1, shared(judged(450.0, "w1", "w2")))]
    terms = terms_figure(several, SLO, subject=SUBJECT)
    assert terms is not None
    assert all("(worst window)" in ax.get_title() for ax in terms.axes if ax.axison)
    assert history_figure(several, subject=SUBJECT).axes[0].get_ylabel() == \
        "goodput share, worst window"
    assert "in its worst window" in caption("terms.png", several, None)
