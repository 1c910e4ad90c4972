"""Progress on stderr: a plain line now and then off a terminal, elapsed time and ETA."""

from __future__ import annotations

import io

import pytest

from slopilot.engine.sim.progress import ProgressReport, duration_text


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_come_every_interval_with_elapsed_eta_and_rate() -> None:
    out, clock = io.StringIO(), FakeClock()
    report = ProgressReport("simulate", 1000, "s simulated", stream=out, tty=False,
                            every_s=10.0, clock=clock, rate_unit="sim-s/s")
    clock.t += 5
    report.update(50)  # under the interval: nothing yet
    assert out.getvalue() == ""
    clock.t += 5
    report.update(100)
    assert out.getvalue() == ("simulate: 100/1,000 s simulated (10%), 10 s elapsed, "
                              "ETA 1 min 30 s, 10.0 sim-s/s\n")
    clock.t += 90
    report.update(1000, status="done")
    report.close()
    last = out.getvalue().splitlines()[-1]
    assert last == "simulate: 1,000/1,000 s simulated (100%), 1 min 40 s elapsed, " \
                   "10.0 sim-s/s, done"


def test_no_eta_before_any_work_and_a_note_is_its_own_line() -> None:
    out, clock = io.StringIO(), FakeClock()
    report = ProgressReport("tune", 30, "simulations", stream=out, tty=False, clock=clock)
    assert report.eta_s() is None and "ETA" not in report.line()
    report.note("warning: long")
    assert out.getvalue() == "warning: long\n"


def test_a_terminal_gets_a_bar_and_no_lines() -> None:
    out = io.StringIO()
    with ProgressReport("simulate", 10, "s", stream=out, tty=True) as report:
        report.update(5)
    assert "simulate: 5/10" not in out.getvalue()


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0 s"), (59, "59 s"), (65, "1 min 05 s"),
                                               (3725, "1 h 02 min")])
def test_durations_read_like_a_person_writes_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_total_must_be_positive() -> None:
    with pytest.raises(ValueError, match="total=0"):
        ProgressReport("x", 0, "s", stream=io.StringIO(), tty=False)
