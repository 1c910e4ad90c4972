"""The tune report's plots and captions, read as their reader reads them: the points a
panel draws, its tick labels, and what the caption beside it says is drawn."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.objective import HEADROOM, NO_SAMPLES, WindowResult, score
from slopilot.tuner.study.report_plots import history_figure, terms_figure
from slopilot.tuner.study.verdict import robust_verdict
from tests.support.summaries import figures, window
from tests.tuner.test_report import SUBJECT

SLO = load_scenario("tiny-cpu").slo  # P0 300/60 ms, P1 1000/150 ms


@pytest.fixture(autouse=True)
def _closed_figures() -> Iterator[None]:
    """The figures each test reads, closed after it (pyplot keeps every one open)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def judged(p0: tuple[float | None, float | None], p1: tuple[float, float]):  # type: ignore[no-untyped-def]
    s = window({"p0": figures(*p0, 10.0), "p1": figures(*p1, 100.0)})
    return robust_verdict({}, [WindowResult("w", "w: 0-1 s", score(s, SLO))], HEADROOM)


def drawn_y(ax) -> list[float]:  # type: ignore[no-untyped-def]
    """Every scattered point's y on a panel, the start config's star included."""
    return sorted(float(y) for c in ax.collections for _, y in c.get_offsets())


def test_a_trial_without_samples_of_a_term_is_not_drawn_as_a_tiny_p99() -> None:
    """A trial whose windows had no P0 token gaps has no P0 TBT P99 (NO_SAMPLES): the
    panel drew it at 0.1 % of the limit (0.06 ms), on a log axis forced by that point
    alone, so the trial read as the best P0 TBT of the study."""
    measured = [judged((250.0, 40.0), (500.0, 50.0)), judged((260.0, 45.0), (520.0, 55.0))]
    silent = judged((280.0, None), (540.0, 60.0))
    assert silent.constraints[1] == NO_SAMPLES
    fig = terms_figure([(0, measured[0]), (1, silent), (2, measured[1])], SLO, subject=SUBJECT)
    assert fig is not None
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("P0 TBT"))
    assert drawn_y(panel) == [40.0, 45.0]
    assert panel.get_yscale() == "linear"
    assert "no samples" in panel.get_title() and "trial 1" in panel.get_title()


def test_the_trial_axis_has_whole_trial_numbers_for_a_one_trial_study() -> None:
    """One trial (the demo's live study, `tune --trials 1`): the axis read -0.04 ... 0.04."""
    results = [(0, judged((250.0, 40.0), (500.0, 50.0)))]
    fig = terms_figure(results, SLO, subject=SUBJECT)
    assert fig is not None
    for fig_ in (fig, history_figure(results, subject=SUBJECT)):
        for ax in fig_.axes:
            if not ax.axison or ax.get_xlabel() != "trial":
                continue
            fig_.canvas.draw()
            labels = [t.get_text().replace("\u2212", "-") for t in ax.get_xticklabels()
                      if t.get_text()]
            assert labels and all(lab.lstrip("-").isdigit() for lab in labels), labels


def test_captions_name_only_what_the_plots_draw(tmp_path: Path) -> None:
    """The demo's live study has no start config and no headroom line: its report said
    "the star is the scenario's start config" and "right of the dashed line a trial
    lacks the headroom" beside plots with neither."""
    from slopilot.tuner.study.report import write_report
    from slopilot.tuner.study.space import SearchSpace
    from slopilot.tuner.study.storage import open_study
    from slopilot.tuner.study.tuner import Tuner

    tuner = Tuner(open_study(None, "live"), SearchSpace.from_bounds())
    number, config = tuner.ask()
    live = score(window({"p0": figures(250.0, 40.0, 10.0), "p1": figures(500.0, 50.0, 9.0)}),
                 SLO, config)
    assert live.margin == 0.0 and live.feasible
    tuner.tell(number, live)
    text = write_report(tuner, SLO, tmp_path, title="T", subject=SUBJECT).read_text()
    assert not re.search(r"\bstar\b", text)  # the plots' marker ("started" is not it)
    assert "dashed" not in text and "headroom" not in text.split("## Plots")[1]

    tuner = Tuner(open_study(None, "offline"), SearchSpace.from_bounds())
    number, config = tuner.ask()
    missed = dataclasses.replace(judged((900.0, 40.0), (500.0, 50.0)), config=config)
    tuner.tell(number, missed)
    text = write_report(tuner, SLO, tmp_path, title="T", start=missed, subject=SUBJECT).read_text()
    plots = text.split("## Plots")[1]
    assert 'The start config is drawn as the trials are, at the trial axis\'s "start": ' \
        'a red cross, it misses the SLO.' in plots
    assert 'The start config is the point named "start"' in plots
    assert "dashed" in plots
    assert "green trials hold" not in plots and "no trial holds the SLO" in plots


def test_a_live_trial_judged_on_two_windows_says_its_table_is_the_last_one(
        tmp_path: Path) -> None:
    """A live trial within the headroom of a limit is confirmed on a second window and
    judged on both (the worse term, the lower goodput). The demo's report showed the
    second window alone as "the window": goodput 119 tok/s, P0 TTFT p99 730 ms, beside a
    top-trials row and plots that said 97.8 tok/s and 735 ms."""
    from slopilot.tuner.loop.trial_window import _with_first_window
    from slopilot.tuner.study.report import write_report
    from slopilot.tuner.study.space import SearchSpace
    from slopilot.tuner.study.storage import open_study
    from slopilot.tuner.study.tuner import Tuner

    tuner = Tuner(open_study(None, "live"), SearchSpace.from_bounds())
    number, config = tuner.ask()
    first = score(window({"p0": figures(735.0, 25.0, 40.0), "p1": figures(494.0, 34.0, 57.8)}),
                  SLO, config)
    second = score(window({"p0": figures(730.0, 20.0, 56.0), "p1": figures(296.0, 27.0, 63.0)}),
                   SLO, config)
    both = _with_first_window(second, first)
    assert both.goodput_tok_s == 97.8 and both.summary == second.summary
    tuner.tell(number, both)
    text = write_report(tuner, SLO, tmp_path, title="T", subject=SUBJECT).read_text()
    best = text.split("## The best trial")[1].split("## Top")[0]
    assert "goodput 119 tok/s" in best  # the table's own window, as before
    assert "judged on more than this window" in best and "97.8 tok/s" in best


def _ticks(fig, ax) -> list[str]:  # type: ignore[no-untyped-def]
    fig.canvas.draw()
    return [t.get_text().replace("\u2212", "-") for t in ax.get_xticklabels() if t.get_text()]


def _points(ax, colour: str) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """The (x, y) of the points an axis scatters in ``colour`` (a matplotlib name)."""
    from matplotlib.colors import to_rgba

    out = []
    for c in ax.collections:
        faces = [tuple(f[:3]) for f in c.get_facecolors()] or \
            [tuple(f[:3]) for f in c.get_edgecolors()]
        for k, (x, y) in enumerate(c.get_offsets()):
            if faces and faces[k % len(faces)] == to_rgba(colour)[:3]:
                out.append((float(x), float(y)))
    return sorted(out)


HOLDS = dataclasses.replace(judged((200.0, 30.0), (400.0, 40.0)), objective=0.99941)
MISSES = judged((200.0, 30.0), (1400.0, 40.0))  # P1 TTFT 1,400 ms against 1,000 ms


def test_the_history_draws_the_start_config_and_its_best_so_far_begins_there() -> None:
    """rep_a3: the report kept the start config (worst-window share 0.99941), while the
    history drew no start config and its "best that holds, so far" line was trial 0's
    0.99927."""
    from slopilot.tuner.study.report_plots import START

    trials = [(0, dataclasses.replace(HOLDS, objective=0.99927)), (1, MISSES)]
    assert HOLDS.feasible and not MISSES.feasible
    fig = history_figure(trials, start=HOLDS, subject=SUBJECT)
    ax = fig.axes[0]
    assert (START, 0.99941) in _points(ax, "tab:green")
    best = next(line for line in ax.get_lines() if line.get_label() == "best that holds, so far")
    assert set(best.get_ydata()) == {0.99941}
    ticks = _ticks(fig, ax)
    assert "start" in ticks and "-1" not in ticks, ticks
    missed = history_figure(trials, start=MISSES, subject=SUBJECT)
    assert (START, MISSES.value) in _points(missed.axes[0], "tab:red")


def test_the_terms_draw_the_start_config_in_the_colour_of_its_outcome() -> None:
    """rep_b3's start config missed (483 ms against 500 ms with a 450 ms headroom line),
    rep_a3's held: both were the same blue star, at a tick that read "-1"."""
    from slopilot.tuner.study.report_plots import START

    trials = [(0, judged((200.0, 30.0), (500.0, 40.0)))]
    for start, colour, other in ((MISSES, "tab:red", "tab:green"),
                                 (HOLDS, "tab:green", "tab:red")):
        fig = terms_figure(trials, SLO, start, subject=SUBJECT)
        assert fig is not None
        panel = next(ax for ax in fig.axes if ax.get_title().startswith("P1 TTFT"))
        ttft = 1400.0 if start is MISSES else 400.0
        assert (START, ttft) in _points(panel, colour)
        assert all(x != START for x, _ in _points(panel, other))
        assert not [c for c in panel.collections if c.get_label() == "start config"]
        ticks = _ticks(fig, panel)
        assert "start" in ticks and "-1" not in ticks, ticks


def test_the_pareto_plot_draws_the_start_config_named() -> None:
    from slopilot.tuner.study.report_plots import pareto_figure

    trials = [(0, judged((200.0, 30.0), (500.0, 40.0))), (1, MISSES)]
    for start, colour in ((HOLDS, "tab:green"), (MISSES, "tab:red")):
        ax = pareto_figure(trials, start=start, subject=SUBJECT).axes[0]
        share = max(start.constraints) + 1.0
        assert any(abs(x - share) < 1e-9 and y == start.value
                   for x, y in _points(ax, colour)), (start, _points(ax, colour))
        # MISSES is trial 1 too: one point, both named; each other trial by its number.
        assert sorted(t.get_text() for t in ax.texts) == \
            (["0", "1", "start"] if start is HOLDS else ["0", "start, trial 1"])


def test_every_plot_names_the_replica_count_it_ran_on() -> None:
    """rep_b3's plots were all of 1 replica, its recommendation 2: no plot said which."""
    from slopilot.tuner.study.plot_subject import PlotSubject
    from slopilot.tuner.study.report_plots import pareto_figure

    trials = [(0, HOLDS), (1, MISSES)]
    for n, words in ((1, "on 1 replica"), (2, "on 2 replicas")):
        subject = PlotSubject("scenario x", "a twin", "a run", replicas=n)
        terms = terms_figure(trials, SLO, HOLDS, subject=subject)
        for fig in (history_figure(trials, subject=subject), terms,
                    pareto_figure(trials, subject=subject)):
            title = fig.get_suptitle()
            assert words in title.replace("\n", " "), title


def test_the_start_tick_is_not_overprinted_by_trial_0_on_a_long_study() -> None:
    """30 trials: the axis ticked every 4, and "start" and "0", a unit apart, overprinted
    each other ("start0" in docs/tune_terms.png redrawn on 2026-12-07)."""
    trials = [(n, MISSES) for n in range(30)]
    fig = history_figure(trials, start=MISSES, subject=SUBJECT)
    ticks = _ticks(fig, fig.axes[0])
    assert ticks[0] == "start" and "0" not in ticks and "4" in ticks, ticks
    short = history_figure(trials[:3], start=MISSES, subject=SUBJECT)
    assert _ticks(short, short.axes[0])[:2] == ["start", "0"]


def test_one_trial_beside_the_start_config_ticks_each_once() -> None:
    """With one trial the axis spans less than a unit past 0, and MaxNLocator's ticks
    there (0, 0.1, ...) each read "0": "start 0 0 0 0 0 0 0 0 0 0 0"."""
    trials = [(0, MISSES)]
    for fig in (history_figure(trials, start=MISSES, subject=SUBJECT),
                terms_figure(trials, SLO, start=MISSES, subject=SUBJECT)):
        for ax in fig.axes:
            ticks = _ticks(fig, ax)
            if ticks and ticks[0] == "start":
                assert ticks == ["start", "0"], ticks


def test_a_point_under_its_line_is_not_said_to_miss_that_line() -> None:
    """The terms plot drew a trial that missed on TTFT as a red cross on its TBT panel
    too, 32 ms under a 60 ms line, and the legend called it "misses it": the trial
    misses the SLO, on some term, not that point its line."""
    fig = terms_figure([(0, MISSES)], SLO, subject=SUBJECT)
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() is not None
              for t in ax.get_legend().get_texts()]
    labels += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "misses it" not in labels
    assert "misses the SLO (on this term or another)" in labels, labels


def _nothing_holds() -> list[tuple[int, object]]:
    """rep4: every config read a goodput share of 0 at the same worst term."""
    return [(n, dataclasses.replace(MISSES, objective=0.0)) for n in range(4)]


def test_configs_on_one_point_are_all_named_and_the_share_axis_is_not_a_hair_wide() -> None:
    """rep4's pareto.png drew 5 configs on one point with only "start" named, on a y axis
    of -0.04 to 0.04 (a share of 0 read as noise around it)."""
    from slopilot.tuner.study.report_plots import pareto_figure

    trials = _nothing_holds()
    start = dataclasses.replace(MISSES, objective=0.0)
    for fig in (pareto_figure(trials, start=start, subject=SUBJECT),  # type: ignore[arg-type]
                history_figure(trials, start=start, subject=SUBJECT)):  # type: ignore[arg-type]
        lo, hi = fig.axes[0].get_ylim()
        assert lo <= 0.0 and hi >= 1.0, (lo, hi)
    ax = pareto_figure(trials, start=start, subject=SUBJECT).axes[0]  # type: ignore[arg-type]
    assert [t.get_text() for t in ax.texts] == ["start, trials 0, 1, 2, 3"]


def test_the_recommendation_is_drawn_on_its_own_replica_count() -> None:
    """rep4 recommended trial 2's knobs on 12 replicas; neither plot drew it."""
    from slopilot.tuner.study.report_plots import Recommended, pareto_figure

    trials = _nothing_holds()
    rec = Recommended(dataclasses.replace(HOLDS, objective=1.0), replicas=12, trial=2)
    for fig in (pareto_figure(trials, subject=SUBJECT, recommended=rec),  # type: ignore[arg-type]
                history_figure(trials, subject=SUBJECT, recommended=rec)):  # type: ignore[arg-type]
        ax = fig.axes[0]
        labels = [c.get_label() for c in ax.collections]
        assert "recommended: trial 2's knobs on 12 replicas" in labels, labels
        star = next(c for c in ax.collections if c.get_label().startswith("recommended"))
        (x, y), = star.get_offsets()
        assert y == 1.0
        if fig.axes[0].get_xlabel() == "trial":
            assert x == 2
        else:
            assert abs(x - (max(HOLDS.constraints) + 1.0)) < 1e-9


def test_the_pareto_plot_shows_the_headroom_line_when_every_point_is_past_the_limit() -> None:
    """A reviewer's pareto.png listed "10% headroom" in its legend with the dashed line
    not to be seen: every point was past 200 %, the x axis began at 90 %, and the line
    lay on the axis's left edge."""
    from slopilot.tuner.study.report_plots import pareto_figure

    shares = ((615.0, 780.0, 900.0), (450.0, 600.0), (615.0, 9000.0))  # the last: log
    for p0_ttft in shares:
        trials = [(i, judged((ms, 30.0), (500.0, 40.0))) for i, ms in enumerate(p0_ttft)]
        ax = pareto_figure(trials, subject=SUBJECT).axes[0]
        for x in (1.0 - HEADROOM, 1.0):
            # Where the line falls across the axis: inside it, clear of its edges.
            at = ax.transAxes.inverted().transform(ax.transData.transform((x, 0.0)))[0]
            assert 0.02 < at < 0.98, (p0_ttft, x, at, ax.get_xlim())


def test_the_slo_label_has_room_under_the_top_frame() -> None:
    """rep1's TBT panel: every point far under the 100 ms line, the axis ended just above
    it, and the frame struck through the line's "100 ms" label."""
    results = [(n, judged((100.0, 20.0), (300.0, 25.0 + n))) for n in range(3)]
    fig = terms_figure(results, SLO, subject=SUBJECT)
    assert fig is not None
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("P1 TBT"))
    assert panel.get_ylim()[1] >= 150.0 * 1.1, panel.get_ylim()


def test_a_log_panel_reads_plain_milliseconds() -> None:
    """rep3's TBT panels: a log axis ticked "6×10^2", "2×10^1" in ms, beside linear TTFT
    panels ticked 1000, 2000."""
    results = [(0, judged((100.0, 20.0), (300.0, 20.0))),
               (1, judged((100.0, 20.0), (300.0, 650.0)))]
    fig = terms_figure(results, SLO, subject=SUBJECT)
    assert fig is not None
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("P1 TBT"))
    assert panel.get_yscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in panel.get_yticklabels(minor=False)
              + panel.get_yticklabels(minor=True) if t.get_text()]
    assert labels and not any("times" in t or "^" in t or "×" in t for t in labels), labels
    assert all(t.replace(",", "").isdigit() for t in labels), labels
    top = panel.get_ylim()[1]
    assert top >= 650.0 and top >= 150.0 * 1.1


def test_the_pareto_plot_numbers_each_trial_as_the_table_does() -> None:
    """rep3's pareto.png named only "start": its eight trials' points could not be told
    from one another, nor matched to the top-trials table."""
    from slopilot.tuner.study.report_plots import pareto_figure

    trials = [(n, judged((200.0 + 40 * n, 30.0), (500.0, 40.0 + 5 * n))) for n in range(4)]
    ax = pareto_figure(trials, start=HOLDS, subject=SUBJECT).axes[0]
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(["start", "0", "1", "2", "3"]), texts


def test_two_trials_a_hair_apart_are_named_apart() -> None:
    """rep3's trials 0 and 1 lay a hair apart and their numbers printed as "01"."""
    from slopilot.tuner.study.report_plots import pareto_figure

    trials = [(0, judged((200.0, 30.0), (500.0, 40.0))),
              (1, judged((201.0, 30.0), (500.0, 40.0))),
              (2, judged((280.0, 30.0), (500.0, 40.0)))]
    ax = pareto_figure(trials, subject=SUBJECT).axes[0]
    offsets = {t.get_text(): t.xyann for t in ax.texts}
    assert offsets["0"] != offsets["1"], offsets
    assert offsets["2"] == (4, 6), offsets
