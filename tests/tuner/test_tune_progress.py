"""tune's progress: from the start config on, the best so far, and a warning when long."""

from __future__ import annotations

import io

from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.tune.progress import TuneProgress


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def result(feasible: bool, goodput: float) -> TrialResult:
    return TrialResult({}, goodput, (-0.5,) if feasible else (0.5,), feasible)


def test_a_long_study_is_announced_with_the_ways_to_shorten_it() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = TuneProgress(31, 330.0, trials=30, generated=False, stream=out, tty=False,
                            clock=clock)
    progress.simulated(330.0)
    clock.t = 60.0  # the start config took a minute: 31 of them take 31 minutes
    progress.started()
    text = out.getvalue()
    assert "note: this tune will take about 31 min 00 s (31 evaluations of 330 simulated s " \
           "at 5.5 sim-s/s on this machine" in text
    assert "--trials 15" in text and "--duration 30" in text and "--seeds" not in text


def test_a_short_study_gets_no_warning_and_the_status_shows_the_best() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = TuneProgress(4, 10.0, trials=3, generated=True, stream=out, tty=False,
                            clock=clock)
    progress.simulated(10.0)
    clock.t = 1.0
    progress.started()
    assert "note:" not in out.getvalue()
    progress.trial_done(0, result(False, 50.0))
    assert progress.report is not None and "none holds the SLO yet" in progress.report.status
    progress.trial_done(1, result(True, 42.0))
    progress.trial_done(2, None)  # a failed trial counts
    assert progress.report.status == "trial 3/3, best holds it: mean goodput 42 tok/s"
    progress.close()
    assert out.getvalue().splitlines()[-1].startswith("tune: 10/40 s simulated (25%)")


def test_quiet_prints_nothing() -> None:
    out = io.StringIO()
    progress = TuneProgress(2, 5.0, trials=1, generated=True, stream=out, tty=False,
                            enabled=False)
    progress.simulated(5.0)
    progress.started()
    progress.note("x")
    progress.close()
    assert out.getvalue() == ""


def test_the_whole_trace_check_is_in_the_total_from_the_start() -> None:
    """A reviewer's bar read "ETA 2 s" at 82 % and "ETA 0 s" at 100 %, then fell to 64 %
    for two more minutes of whole-trace replay: its first replay, known from the start,
    is counted from the start; a replay no one could foresee still grows the bar."""
    out, clock = io.StringIO(), FakeClock()
    progress = TuneProgress(2, 100.0, trials=1, generated=False, stream=out, tty=False,
                            clock=clock, whole_s=400.0)
    report = progress.report
    assert report is not None and report.total == 600.0
    progress.simulated(180.0)  # the study, ending early: its runs stop once judged
    clock.t = 18.0
    assert report.eta_s() == 42.0  # (600 - 180) / 10: the replay counted
    progress.replay("capacity search: 2 replicas", 100.0)
    assert report.total == 680.0  # the check's replay still counted after it
    progress.simulated(280.0)
    progress.whole_check_begins()
    feed = progress.replay("whole trace on 1 replica: replaying", 400.0)
    assert report.total == 680.0  # the study's slack dropped, the replay not added again
    feed(400.0)
    assert report.done == report.total
    progress.replay("whole trace on 1 replica: the worst window off the grid", 400.0)
    assert report.total == 1080.0


def test_a_reserved_check_never_run_leaves_the_bar_full() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = TuneProgress(2, 100.0, trials=1, generated=False, stream=out, tty=False,
                            clock=clock, whole_s=400.0)
    progress.simulated(200.0)
    clock.t = 20.0
    progress.close()  # nothing recommended: no whole-trace check
    assert out.getvalue().splitlines()[-1].startswith("tune: 200/200 s simulated (100%)")
