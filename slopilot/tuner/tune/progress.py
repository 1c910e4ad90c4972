"""``slopilot tune``'s progress: simulated seconds from its first simulation (the start
config) on, with elapsed time, ETA and the best result so far; and a warning, once the
start config has shown this machine's speed, when the whole study will be long."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from slopilot.engine.sim.progress import Clock, ProgressReport, duration_text
from slopilot.tuner.study.objective import TrialResult

LONG_S = 10 * 60.0
"""An estimate above this gets a warning (and how to shorten it)."""


class TuneProgress:
    """The bar over ``evaluations`` x ``per_evaluation_s`` simulated seconds."""

    def __init__(self, evaluations: int, per_evaluation_s: float, *, trials: int,
                 generated: bool, stream: TextIO | None = None, tty: bool | None = None,
                 clock: Clock = time.monotonic, enabled: bool = True,
                 whole_s: float = 0.0) -> None:
        self.evaluations, self.per_evaluation_s = evaluations, per_evaluation_s
        # The whole-trace check's first replay, counted from the start: without it the
        # bar read "ETA 0 s" at 100 % and then fell to 64 % for minutes of replay.
        self.whole_s = whole_s
        self.trials, self.generated = trials, generated
        self.trials_done = 0
        self.best: TrialResult | None = None
        self.report: ProgressReport | None = None
        if enabled:
            self.report = ProgressReport("tune", evaluations * per_evaluation_s + whole_s,
                                         "s simulated", stream=stream, tty=tty, clock=clock,
                                         rate_unit="sim-s/s")

    def simulated(self, seconds: float) -> None:
        """The evaluator's feed: virtual seconds simulated so far."""
        if self.report is not None:
            self.report.update(seconds)

    def started(self) -> None:
        """The start config is done: the machine's speed is known; warn if long."""
        self._status("start config done")
        warning = self.warning()
        if warning and self.report is not None:
            self.report.note(warning)

    def trial_done(self, number: int, result: TrialResult | None) -> None:
        self.trials_done += 1
        if result is not None and result.feasible and (
                self.best is None or result.value > self.best.value):
            self.best = result
        best = ("none holds the SLO yet" if self.best is None else
                f"best holds it: mean goodput {self.best.goodput_tok_s:,.0f} tok/s")
        self._status(f"trial {self.trials_done}/{self.trials}, {best}")

    def _status(self, text: str) -> None:
        if self.report is not None:
            self.report.update(self.report.done, status=text)

    def estimate_s(self) -> float | None:
        """The whole study's wall time at the speed so far."""
        if self.report is None:
            return None
        rate = self.report.rate()
        return None if rate is None else self.evaluations * self.per_evaluation_s / rate

    def warning(self) -> str | None:
        total = self.estimate_s()
        if total is None or total <= LONG_S or self.report is None:
            return None
        rate = self.report.rate() or 0.0
        ways = [f"--trials {max(5, self.trials // 2)}", "--duration 30 (shorter windows)"]
        if self.generated:
            ways.append("--seeds 2")
        return (f"note: this tune will take about {duration_text(total)} ("
                f"{self.evaluations} evaluations of {self.per_evaluation_s:,.0f} simulated s "
                f"at {rate:,.1f} sim-s/s on this machine, capacity search not counted); "
                f"shorten it with {', '.join(ways)}")

    def whole_check_begins(self) -> None:
        """The whole-trace check's replays follow: its first is no longer to be counted
        apart (its own ``replay`` counts it)."""
        self.whole_s = 0.0

    def replay(self, status: str, planned_s: float) -> Callable[[float], None]:
        """A replay past the study (the capacity search's, the whole-trace check's): the
        bar's total becomes what is done, this replay's ``planned_s`` simulated seconds
        and the whole-trace check's first replay where it has not begun
        (``whole_check_begins``), and shows ``status``; the feed returned is told the
        seconds simulated in it so far. Without it the bar sat at 100 % for the minutes
        those replays take."""
        report = self.report
        if report is None:
            return lambda _: None
        base = report.done
        # The study's runs end once every request they count is judged, short of their
        # plan: that slack is no work left.
        report.resize(base + planned_s + self.whole_s)
        report.update(base, status=status)
        return lambda seconds: report.update(base + min(max(seconds, 0.0), planned_s))

    def note(self, text: str) -> None:
        if self.report is not None:
            self.report.note(text)

    def warn(self, line: str) -> None:
        """A warning on stderr, whatever --quiet says: above the bar where one shows."""
        if self.report is not None:
            self.report.note(line)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.report is not None:
            if self.whole_s:
                # Counted, never run (nothing was recommended): what was done is all.
                self.report.finish()
            self.report.close()
