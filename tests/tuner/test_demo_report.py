"""The demo's report on disk: every file it writes is whole, whichever write fails."""

from __future__ import annotations

import builtins
import errno
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slopilot.tuner.local.demo_report import Sample, TrialMark, write_demo_report
from tests.tuner.test_report import SLO, SUBJECT, study

SAMPLES = [Sample(t_s=float(t), p99_ms={"p1_ttft_p99_ms": 100.0 + t}, token_budget=512,
                  chunk_size=256, replicas=1, trial=None) for t in range(4)]


class _DiskFillsMidWrite:
    """A file whose first write lands half its bytes and then fails as a full disk does."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def write(self, data: Any) -> int:
        self._fh.write(data[:len(data) // 2])
        self._fh.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> _DiskFillsMidWrite:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def _failing_open(folder: Path, nth: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``open`` that lets the first ``nth - 1`` writes into ``folder`` through and fails
    the ``nth`` part-way (a file, or a descriptor os.fdopen wraps, opened for writing)."""
    seen = [0]

    def fake(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        fh = real(file, mode, *args, **kwargs)
        where = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else file
        if not set(mode) & set("wax+") or Path(os.path.abspath(where)).parent != folder:
            return fh
        seen[0] += 1
        return _DiskFillsMidWrite(fh) if seen[0] == nth else fh

    return fake


def _write(folder: Path) -> None:
    write_demo_report(folder / "report.md", study(ttft_of_budget=True, n=6), SLO, SAMPLES,
                      ["[t+1s] ALERT  P1 TTFT", "[t+2s] COMMIT token_budget=512"],
                      shift_at_s=2.0, subject=SUBJECT)


def test_a_write_that_fails_part_way_leaves_every_report_file_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # report.md was written by the tune report, read back and written again in place with
    # the timeline, and the plots and timeline.json in place: a crash part-way left half
    # a file, or a report.md without its timeline.
    new = tmp_path / "whole"
    _write(new)
    written = {p.name: p.read_bytes() for p in new.iterdir()}
    assert {"report.md", "timeline.png", "timeline.json", "history.png"} <= written.keys()
    assert b"## Timeline" in written["report.md"]
    folder = tmp_path / "report"
    folder.mkdir()
    for nth in range(1, len(written) + 1):
        for name in written:
            (folder / name).write_bytes(b"an earlier demo's whole " + name.encode())
        fake = _failing_open(folder, nth, builtins.open)
        with monkeypatch.context() as m:
            m.setattr(builtins, "open", fake)
            m.setattr(io, "open", fake)
            with pytest.raises(OSError, match="No space left"):
                _write(folder)
        now = {p.name: p.read_bytes() for p in folder.iterdir()}
        assert now.keys() == written.keys(), (nth, now.keys())  # no temporary left
        for name, data in now.items():
            assert data in (b"an earlier demo's whole " + name.encode(), written[name]), (
                nth, name)
        # report.md goes last: while it is the earlier one, it links no half plot.
        if now["report.md"] == written["report.md"]:
            assert now == written, nth


def test_a_run_without_samples_leaves_no_earlier_runs_timeline_behind(tmp_path: Path) -> None:
    """A run that drew no timeline (no samples) linked timeline.png anyway, and an
    earlier run's plot in the folder read as this run's."""
    _write(tmp_path)
    assert (tmp_path / "timeline.png").exists()
    write_demo_report(tmp_path / "report.md", study(ttft_of_budget=True, n=6), SLO, [],
                      ["[t+1s] nothing happened"], shift_at_s=2.0, subject=SUBJECT)
    assert not (tmp_path / "timeline.png").exists()
    report = (tmp_path / "report.md").read_text()
    assert "timeline.png" not in report and "## Timeline" in report


def test_the_timeline_tells_its_knobs_its_trials_and_the_shift_apart() -> None:
    """Read as its reader reads it: with ``token_budget`` and ``chunk_size`` equal (the
    demo's start, 2048 and 2048), the budget's line lay under the chunk's and only one
    knob showed; the canary trial's shading was the chunk line's own orange, named only
    in the axis label; the dashed line of the load's shift was in no legend."""
    from slopilot.tuner.local.demo_report import timeline_figure

    samples = [Sample(t_s=float(t), p99_ms={"p1_ttft_p99_ms": 100.0}, token_budget=2048,
                      chunk_size=2048, replicas=1,
                      trial=TrialMark(0, canary=True, config={}) if t == 2 else None)
               for t in range(4)]
    fig = timeline_figure(samples, SLO, shift_at_s=1.0, subject=SUBJECT)
    ax_lat, ax_knob, _ = fig.axes
    budget, chunk = ax_knob.get_lines()[:2]
    assert list(budget.get_ydata()) == list(chunk.get_ydata())  # the case in point
    assert budget.get_linestyle() != chunk.get_linestyle()  # both still seen
    labels = [t.get_text() for t in ax_knob.get_legend().get_texts()]
    assert "canary trial" in labels
    shading = next(p for p in ax_knob.patches)
    assert shading.get_facecolor()[:3] not in (budget.get_color(), chunk.get_color())
    assert "load shift" in [t.get_text() for t in ax_lat.get_legend().get_texts()]


def test_each_trial_is_one_span_named_by_its_number() -> None:
    """The demo's timeline shaded a second around each sample taken during a trial: where
    the demo sampled every 0.2 s (a trial's first seconds) the shades piled up dark, where
    a busy machine sampled every 1.3 s they left white gaps, and trial 0 (cut after 0.4 s)
    ran into trial 1 with nothing between them. A reader saw stripes, not two trials.
    Now each trial is one span, from its first sample to the sample after its last, named
    by its number, and said canary or all replicas as it ran."""
    from slopilot.tuner.local.demo_report import timeline_figure

    def at(t: float, trial: TrialMark | None) -> Sample:
        return Sample(t_s=t, p99_ms={"p1_ttft_p99_ms": 100.0}, token_budget=2048,
                      chunk_size=2048, replicas=2, trial=trial)

    first, second = TrialMark(0, canary=True, config={}), TrialMark(1, canary=True, config={})
    third = TrialMark(2, canary=False, config={})
    samples = [at(9.0, None), at(10.0, first), at(10.2, first), at(10.4, second),
               at(10.6, second), at(11.9, second), at(13.3, second), at(14.5, None),
               at(20.0, third), at(21.0, third), at(22.0, None)]
    fig = timeline_figure(samples, SLO, shift_at_s=5.0, subject=SUBJECT)
    _, ax_knob, _ = fig.axes
    spans = sorted((round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6))
                   for p in ax_knob.patches)
    assert spans == [(10.0, 10.4), (10.4, 14.5), (20.0, 22.0)]
    # Trials 0 and 1 start 0.4 s apart on a 13 s axis: one label names both.
    assert [t.get_text() for t in ax_knob.texts] == ["trials 0, 1", "trial 2"]
    labels = [t.get_text() for t in ax_knob.get_legend().get_texts()]
    assert "canary trial" in labels and "trial on all replicas" in labels


def _latency_legend(samples: list[Sample]) -> list[str]:
    from slopilot.tuner.local.demo_report import timeline_figure

    fig = timeline_figure(samples, SLO, shift_at_s=1.0, subject=SUBJECT)
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_the_timeline_draws_every_class_sent_and_names_one_it_has_no_figures_for() -> None:
    """The demo's load sends P2 (20 %, then 10 %), and the timeline drew only P0 and P1:
    a reader could not tell a class left out from one never sent. P2 is drawn without an
    SLO line (best effort), and a class with no figure in any window says so."""
    from slopilot.tuner.local.demo_story import p99s
    from tests.support.summaries import figures, window

    assert "p2_ttft_p99_ms" in p99s(window({"p2": figures(900.0, 80.0, 10.0)}))
    every = [Sample(t_s=float(t), p99_ms={f"{c}_{k}_p99_ms": 100.0 for c in ("p0", "p1", "p2")
                                          for k in ("ttft", "tbt")},
                    token_budget=512, chunk_size=256, replicas=1, trial=None)
             for t in range(4)]
    legend = _latency_legend(every)
    assert "P2 TTFT P99 (best effort, no SLO)" in legend
    assert not any("no figures" in label for label in legend)
    legend = _latency_legend(SAMPLES)  # P1 only
    assert "P0: no figures in any window" in legend
    assert "P2: no figures in any window" in legend


def test_the_report_tells_each_episode_what_ended_committed_and_the_machine(
        tmp_path: Path) -> None:
    """The report showed trial 1 as "The best trial" where trial 2 had replaced it, had
    no word of the machine's load, and its story was the printed lines alone."""
    from slopilot.tuner.local.demo_episodes import Episode
    from slopilot.tuner.local.demo_story import DemoResult
    from slopilot.tuner.study.results import rank

    tuner = study(ttft_of_budget=True, n=6)
    ranked = sorted(tuner.results(), key=lambda nr: rank(nr[1]), reverse=True)
    best, other = ranked[0][0], ranked[-1][0]
    first = Episode(1, 130.0, 130.0, "SlopilotTBTP99High[p0,critical]", ("p0",))
    first.trials, first.configs = [best], {best: dict(ranked[0][1].config)}
    first.acted("commit", 149.0, ranked[0][1].config, 2)
    first.close("episode 2 opened", 220.0)
    second = Episode(2, 220.0, 220.0, "SlopilotTTFTP99Sustained[p0,warning]", ("p0",))
    second.trials, second.configs = [other], {other: dict(ranked[-1][1].config)}
    second.acted("commit", 233.0, ranked[-1][1].config, 2)
    second.close("the end of the run", 240.0)
    result = DemoResult(report=tmp_path / "report.md", episodes=[first, second],
                        machine=["machine: 2 CPUs; ...: BUSY in 3 of them (t+200.0s to "
                                 "t+215.0s; ...)"], machine_busy=True)
    write_demo_report(tmp_path / "report.md", tuner, SLO, SAMPLES, ["[t+  1.0s] x"],
                      shift_at_s=2.0, subject=SUBJECT, result=result,
                      rule="a restore rule, in words", busy=[(1.0, 2.0)])
    report = (tmp_path / "report.md").read_text()
    happened = report.index("## What happened")
    assert happened < report.index("## The best trial")  # read first
    assert f"- {first.describe()}" in report and f"- {second.describe()}" in report
    assert f"Ended committed: trial {other}'s config" in report
    assert (f"The best trial below (trial {best}) is the study's best by goodput among the "
            f"trials that held, not the config the replicas ended on (trial {other}'s, "
            "above).") in report
    assert "a restore rule, in words" in report
    assert "## The machine" in report and "BUSY in 3 of them" in report
    assert "busy" in (tmp_path / "timeline.json").read_text()


def test_the_timeline_shades_the_spans_the_machine_was_busy() -> None:
    from slopilot.tuner.local.demo_report import timeline_figure

    fig = timeline_figure(SAMPLES, SLO, shift_at_s=1.0, subject=SUBJECT, busy=[(1.0, 2.5)])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("machine busy") for label in legend), legend
    quiet = timeline_figure(SAMPLES, SLO, shift_at_s=1.0, subject=SUBJECT)
    assert not any(t.get_text().startswith("machine busy")
                   for t in quiet.axes[0].get_legend().get_texts())


def test_the_timeline_marks_each_commit_and_each_restore_or_miss() -> None:
    """The P99 panel showed no commit nor restore: a reader could not hold "SLO restored
    at t+168.6s" against the lines, nor see a miss after it."""
    from slopilot.tuner.local.demo_report import timeline_figure

    fig = timeline_figure(SAMPLES, SLO, shift_at_s=1.0, subject=SUBJECT,
                          events=[(1.5, "commit"), (2.5, "restored"), (3.0, "missed")])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {"commit", "SLO restored", "SLO missed again"} <= set(legend), legend
    marks = {round(line.get_xdata()[0], 1) for line in fig.axes[0].get_lines()
             if line.get_label() in ("commit", "SLO restored", "SLO missed again")}
    assert marks == {1.5, 2.5, 3.0}


def test_the_timeline_marks_each_episodes_alert() -> None:
    """The README says "you see the alert fire", and the timeline had no alert on it: the
    printed line was the only place it showed. Each episode's first alert is marked."""
    from slopilot.tuner.local.demo_episodes import Episode
    from slopilot.tuner.local.demo_report import events_of, timeline_figure
    from slopilot.tuner.local.demo_story import DemoResult

    first = Episode(1, 1.2, 1.2, "SlopilotTBTP99High[p0,critical]", ("p0",))
    first.acted("commit", 2.0, {"chunk_size": 256}, 1)
    quiet = Episode(2, 2.5, None, "", ("p0",))  # opened with no alert firing
    result = DemoResult(report=Path("report.md"), episodes=[first, quiet])
    events = events_of(result)
    assert (1.2, "alert") in events and not any(x == 2.5 for x, _ in events)
    fig = timeline_figure(SAMPLES, SLO, shift_at_s=1.0, subject=SUBJECT, events=events)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "alert fired" in legend, legend
    marks = [line.get_xdata()[0] for line in fig.axes[0].get_lines()
             if line.get_label() == "alert fired"]
    assert marks == [1.2]


def test_the_timeline_breaks_its_lines_where_no_sample_was_taken() -> None:
    """A tick that took 24.5 s left no sample between t+134.5 and t+159.1, and the
    timeline drew straight lines across it as if measured. The lines break where samples
    stand much further apart than the loop's usual step, and the gap is shaded and said."""
    from slopilot.tuner.local.demo_report import timeline_figure

    times = [1.0, 2.0, 3.0, 4.0, 28.5, 29.5, 30.5]
    samples = [Sample(t_s=t, p99_ms={"p1_ttft_p99_ms": 100.0}, token_budget=512,
                      chunk_size=256, replicas=1, trial=None) for t in times]
    fig = timeline_figure(samples, SLO, shift_at_s=2.0, subject=SUBJECT)
    ax_lat = fig.axes[0]
    line = next(x for x in ax_lat.get_lines() if x.get_label() == "P1 TTFT P99")
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    between = [y for x, y in zip(xs, ys, strict=True) if 4.0 < x < 28.5]
    assert between and all(y != y for y in between), (xs, ys)  # NaN: the line breaks
    legend = [t.get_text() for t in ax_lat.get_legend().get_texts()]
    assert any(label.startswith("no sample") for label in legend), legend
    steady = timeline_figure(SAMPLES, SLO, shift_at_s=1.0, subject=SUBJECT)
    assert not any(t.get_text().startswith("no sample")
                   for t in steady.axes[0].get_legend().get_texts())


def _strict(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JSON.parse refuses it)")


def test_timeline_json_is_standard_json_with_null_where_a_window_had_no_figure(
        tmp_path: Path) -> None:
    """A window with no P99 wrote a bare NaN: 53 of them in one run, and JSON.parse (or
    jq) refused the file."""
    import json
    import math

    samples = [Sample(t_s=0.0, p99_ms={"p0_ttft_p99_ms": math.nan,
                                       "p1_ttft_p99_ms": math.inf}, token_budget=512,
                      chunk_size=256, replicas=1, trial=None), *SAMPLES[1:]]
    write_demo_report(tmp_path / "report.md", study(ttft_of_budget=True, n=6), SLO,
                      samples, [], shift_at_s=2.0, subject=SUBJECT)
    data = json.loads((tmp_path / "timeline.json").read_text(), parse_constant=_strict)
    assert data["samples"][0]["p99_ms"] == {"p0_ttft_p99_ms": None, "p1_ttft_p99_ms": None}
    assert data["samples"][1]["p99_ms"] == {"p1_ttft_p99_ms": 101.0}
