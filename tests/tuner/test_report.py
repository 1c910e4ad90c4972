"""Study reports: importance only when meaningful and in user names; the sections and
plots of a tune's report."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import optuna
import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.importance import importance, inert_knobs
from slopilot.tuner.study.objective import HEADROOM, WindowResult, score
from slopilot.tuner.study.plot_subject import PlotSubject
from slopilot.tuner.study.report import ReportContext, write_report
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import robust_verdict
from tests.support.summaries import figures, window

SLO = load_scenario("tiny-cpu").slo
SUBJECT = PlotSubject("scenario tiny-cpu", "a test's twin", "a test's run")


def study(ttft_of_budget: bool, n: int = 12) -> Tuner:
    """Trials whose P1 TTFT follows the token budget (or stays put), no P0 traffic and no
    preemption: the preemption knobs and p0_preempt_utilization cannot have acted."""
    tuner = Tuner(open_study(None, "imp", sampler="random", seed=1), SearchSpace.from_bounds())
    for _ in range(n):
        number, config = tuner.ask()
        ttft = 200.0 + config["token_budget"] / 10 if ttft_of_budget else 400.0
        s = window({"p1": figures(ttft, 50.0, 100.0)})
        verdict = robust_verdict(config, [WindowResult("w", "w: 0-1 s", score(s, SLO))],
                                 HEADROOM)
        tuner.tell(number, dataclasses.replace(verdict, config=config))
    return tuner


def test_importance_names_knobs_as_users_do_and_leaves_out_inert_ones() -> None:
    tuner = study(ttft_of_budget=True)
    imp = importance(tuner.study, [r for _, r in tuner.results()])
    assert imp.values is not None and imp.target == "the worst SLO term"
    assert "token_budget" in imp.values and "chunk_size" in imp.values
    assert "token_budget/256" not in imp.values and "chunk_fraction" not in imp.values
    for inert in ("preemption_mode", "swap_timeout_ms", "p0_preempt_utilization"):
        assert inert not in imp.values and inert in imp.reason
    assert max(imp.values, key=lambda k: imp.values[k]) == "token_budget"  # type: ignore[index]


def test_importance_reads_the_trials_of_the_study_s_latest_encoding() -> None:
    # A study resumed after the budget's parameter changed (an earlier slopilot's rank, or
    # another budget_align): two parameters named token_budget, whose shares overwrote
    # each other (the rank's, over four trials of one config, said 0).
    new = study(ttft_of_budget=True).study.get_trials()
    resumed = open_study(None, "resumed")
    first = new[0]
    old = {("token_budget_rank" if k == "token_budget/256" else k): v
           for k, v in first.distributions.items()}
    for r in range(1, 5):
        params = {("token_budget_rank" if k == "token_budget/256" else k): v
                  for k, v in first.params.items()}
        resumed.add_trial(optuna.trial.create_trial(
            params={**params, "token_budget_rank": r}, distributions=old, value=float(r),
            user_attrs={**first.user_attrs, "constraints": [float(r)]}))
    resumed.add_trials(new)
    imp = importance(resumed, [r for _, r in Tuner(resumed, SearchSpace.from_bounds()).results()])
    assert imp.values is not None, imp.reason
    assert max(imp.values, key=lambda k: imp.values[k]) == "token_budget"  # type: ignore[index]


def test_no_importance_when_nothing_varies() -> None:
    tuner = study(ttft_of_budget=False)
    imp = importance(tuner.study, [r for _, r in tuner.results()])
    assert imp.values is None and "nothing to attribute" in imp.reason


def test_inert_knobs_read_the_windows() -> None:
    busy = window({"p0": figures(50.0, 10.0, 5.0), "p1": figures(100.0, 20.0)},
                  preemptions=3.0)
    r = score(busy, SLO)
    assert inert_knobs([r]) == {}


def test_an_infeasible_tune_report_has_the_verdict_capacity_and_plots(tmp_path: Path) -> None:
    tuner = study(ttft_of_budget=True, n=4)
    ctx = ReportContext(
        verdict="No configuration tried holds the SLO on 1 replica: P1 TTFT p99 ...",
        judged_on="judged on 3 workload seeds, 8 s each",
        windows=[{"name": "seed 0", "start_s": 0.0, "end_s": 8.0, "warmup_s": 0.0,
                  "drain_s": 2.0, "arrival_rate": None, "token_rate": None}],
        recommended_replicas=2, recommended_config={"token_budget": 512},
        capacity=["2 replicas hold the SLO ..."], command="slopilot tune --scenario x",
        check_command="slopilot simulate --scenario x --replicas 2", timing="4 evaluations")
    path = write_report(tuner, SLO, tmp_path, context=ctx, title="T", subject=SUBJECT)
    text = path.read_text()
    assert text.index("**No configuration tried holds") < text.index("## SLO")
    for part in ("## What each trial was judged on", "| seed 0 | 0-8 | 0 | 2 | - | - |",
                 "## Capacity", "2 replicas hold", "slopilot simulate --scenario x",
                 "## The best trial, per window and class", "**w: 0-1 s**",
                 "Knob importance is left out: needs at least 8"):
        assert part in text
    for png in ("history.png", "terms.png", "pareto.png"):
        assert (tmp_path / png).is_file()


def test_the_history_of_a_study_where_nothing_holds_says_so_and_draws_no_phantoms() -> None:
    """Where no trial holds the SLO, the history's legend named a green "holds the SLO"
    and a "best that holds, so far" line that the plot did not have."""
    from slopilot.tuner.study.report_plots import history_figure

    missed = score(window({"p1": figures(60_000.0, 50.0, 100.0)}), SLO)  # TTFT a minute
    results = [(n, missed) for n in range(4)]
    assert not missed.feasible
    fig = history_figure(results, subject=SUBJECT)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["misses the SLO"]
    assert ax.get_title() == "Trial history: no trial holds the SLO"


def test_a_report_written_over_an_earlier_one_leaves_none_of_its_plots(tmp_path: Path) -> None:
    # An earlier, longer study drew importance.png; this one (4 trials) draws none, and its
    # report.md no longer links it. Left beside it, the old plot read as this study's.
    (tmp_path / "importance.png").write_bytes(b"an earlier study's plot")
    (tmp_path / "notes.txt").write_text("the user's own file")
    write_report(study(ttft_of_budget=True, n=4), SLO, tmp_path, title="T", subject=SUBJECT)
    assert not (tmp_path / "importance.png").exists()
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"
    assert (tmp_path / "history.png").is_file()


def test_a_write_that_fails_leaves_the_earlier_report_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # report.md was written in place: a crash part-way left half of it, and no old one.
    (tmp_path / "report.md").write_text("an earlier study's whole report\n")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_report(study(ttft_of_budget=True, n=0), SLO, tmp_path, title="T", subject=SUBJECT)
    assert (tmp_path / "report.md").read_text() == "an earlier study's whole report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary left
    monkeypatch.undo()
    write_report(study(ttft_of_budget=True, n=0), SLO, tmp_path, title="T", subject=SUBJECT)
    assert (tmp_path / "report.md").read_text().startswith("# T\n")


def test_a_trial_without_samples_reads_no_worst_term_in_the_top_tables() -> None:
    """A term no window had a request to measure is ``NO_SAMPLES`` (-1: no share of its
    limit); the top tables printed ``max(...) + 1`` and read such a trial's worst term as
    0 %, the best any trial could show, where the others' tables say "-"."""
    from slopilot.tuner.study.objective import NO_SAMPLES, TrialResult
    from slopilot.tuner.study.report import _top
    from slopilot.tuner.tune.output import top_row

    names = ("p0.ttft_p99", "p0.tbt_p99")
    empty = TrialResult({"token_budget": 512}, 0.0, (NO_SAMPLES, NO_SAMPLES), False,
                        constraint_names=names)
    measured = dataclasses.replace(empty, constraints=(0.5, NO_SAMPLES))
    lines = _top([(0, empty), (1, measured)], 2)
    assert "| 0 | no | - |" in lines[4], lines
    assert "| 1 | no | 150% (P0 TTFT p99) |" in lines[5], lines
    assert top_row(0, empty)[2] == "-" and top_row(1, measured)[2] == "150%"


def test_a_live_studys_report_leaves_out_the_columns_its_windows_cannot_fill(
        tmp_path: Path) -> None:
    """The demo's report (live trials, Prometheus windows: no request accounting, no
    per-request samples, no goodput share) printed "goodput share" and arrived,
    unfinished, rejected, TTFT mean, max stall and goodput-all columns of "-" only."""
    tuner = Tuner(open_study(None, "live", sampler="random", seed=1), SearchSpace.from_bounds())
    for _ in range(2):
        number, config = tuner.ask()
        tuner.tell(number, score(window({"p1": figures(400.0, 50.0, 100.0)}), SLO, config))
    text = write_report(tuner, SLO, tmp_path, title="T", subject=SUBJECT).read_text()
    top = text.split("## Top 2 trials")[1].split("\n\n")[1]
    assert "goodput share" not in top and "deciding window" not in top, top
    assert "| trial | holds SLO | worst term (share of limit) | goodput (tok/s) |" in top, top
    best = text.split("## The best trial, per window and class")[1].split("## Top")[0]
    header = next(line for line in best.splitlines() if line.startswith("| class |"))
    for gone in ("arrived", "unfinished", "rejected", "TTFT mean", "max stall",
                 "goodput all"):
        assert f"| {gone} |" not in header, header
    for kept in ("finished", "TTFT p99", "TBT p99", "goodput out"):
        assert f"| {kept} |" in header, header
    assert "| p1 | 10 | 400 ms | 50.0 ms |" in best, best
    assert "left out: the live windows" in best, best


def test_the_trial_count_says_which_trials_ran_and_leaves_queued_ones_apart(
        tmp_path: Path) -> None:
    """The demo's report said "0 completed trials of 2" where it started one trial (its
    terminal: "1 trial"): the second was a warm start queued and never run, and the one
    that ran was cut by the end of the run."""
    tuner = study(ttft_of_budget=True, n=2)
    start = tuner.space.config_of(tuner.study.trials[0].params)
    tuner.warm_start([{**start, "max_num_seqs": n} for n in (9, 10)])
    number, _ = tuner.ask()  # the first queued one, running when the report is written
    text = write_report(tuner, SLO, tmp_path, subject=SUBJECT).read_text()
    assert (f"Study `imp`: 2 completed trials of 3 started (trial {number} was unfinished "
            "when the report was written); 1 more queued, never started.") in text
    done = write_report(study(ttft_of_budget=True, n=2), SLO, tmp_path / "b",
                        subject=SUBJECT).read_text()
    assert "Study `imp`: 2 completed trials of 2 started.\n" in done
