"""Every report plot names what it shows: a PNG read alone (pasted into an issue, a
doc, a chat) must say which workload it ran, on which twin and from which run. The
figures are read as built (their suptitle), not as pixels."""

from __future__ import annotations

from typing import Any

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.local.demo_report import Sample, timeline_figure
from slopilot.tuner.study import report_plots as plots
from slopilot.tuner.study.plot_subject import PlotSubject
from tests.tuner.test_report import SLO, study

SUBJECT = PlotSubject.of(load_scenario("tiny-cpu"),
                         run="slopilot tune --scenario tiny-cpu --trials 30 --seed 0")


def suptitle(fig: Any) -> str:
    """The figure's suptitle, its wrapped lines joined again."""
    assert fig._suptitle is not None, "the figure has no suptitle"
    return " ".join(fig._suptitle.get_text().replace("\n    ", " ").split())


def assert_names_its_subject(fig: Any) -> None:
    text = suptitle(fig)
    assert "workload: scenario tiny-cpu" in text
    assert "twin: llama-3-8b on uncalibrated datasheet roofline (A100-80GB, tp=1)" in text
    assert "run: slopilot tune --scenario tiny-cpu --trials 30 --seed 0" in text


def test_each_tune_report_plot_names_the_scenario_the_twin_and_the_run() -> None:
    results = study(ttft_of_budget=True, n=6).results()
    terms = plots.terms_figure(results, SLO, subject=SUBJECT)
    assert terms is not None
    for fig in (plots.history_figure(results, subject=SUBJECT), terms,
                plots.pareto_figure(results, subject=SUBJECT),
                plots.importance_figure({"token_budget": 0.7, "chunk_size": 0.3},
                                        "the worst SLO term", subject=SUBJECT)):
        assert_names_its_subject(fig)
    # The plot's own title stays: the subject is said beside it, not instead.
    assert "The terms that decide feasibility" in suptitle(terms)


def test_the_demo_timeline_names_the_scenario_the_twin_and_the_run() -> None:
    samples = [Sample(t_s=float(t), p99_ms={"p1_ttft_p99_ms": 100.0}, token_budget=2048,
                      chunk_size=2048, replicas=1, trial=None) for t in range(4)]
    assert_names_its_subject(timeline_figure(samples, SLO, shift_at_s=1.0, subject=SUBJECT))


def test_a_long_subject_is_wrapped_to_the_figure_not_clipped() -> None:
    long = PlotSubject("trace " + "/very/long/path" * 12 + "/azure.csv", SUBJECT.twin,
                       SUBJECT.run)
    fig = plots.history_figure(study(ttft_of_budget=True, n=3).results(), subject=long)
    width_chars = fig.get_figwidth() * 15
    assert all(len(line) <= width_chars for line in fig._suptitle.get_text().splitlines())


def test_the_demo_names_its_run_by_its_options_and_start() -> None:
    from slopilot.tuner.local.demo import DemoOptions, run_label

    assert run_label(DemoOptions(seed=3), started=0.0) == (
        "slopilot demo --executor simulated --replicas 2 --duration 240 --seed 3, "
        "started 1970-01-01 00:00 UTC")
