"""What the demo prints and reports while its loop runs: the story, line by line.

Every line is timestamped from the start (``Narrator``) and kept for the report; ``Story``
turns each tick's alerts, decision and window into lines and into the ``DemoResult``
the command's caller reads (when the alert fired, how many trials, when the SLO was
restored).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from slopilot.engine.request import Priority
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.ports import AlertReader
from slopilot.tuner.prometheus.alerts import Alert
from slopilot.tuner.study.objective import score


class RecordingAlerts:
    """Passes alerts through and remembers what fired, for the printout and report."""

    def __init__(self, inner: AlertReader) -> None:
        self.inner = inner
        self.current: list[Alert] = []

    def firing(self) -> list[Alert]:
        self.current = self.inner.firing()
        return self.current


@dataclass
class DemoResult:
    report: Path
    alert_at_s: float | None = None
    trials: int = 0
    commit_at_s: float | None = None
    restored_at_s: float | None = None
    scaled: bool = False
    lines: list[str] = field(default_factory=list)
    twin: Mapping[str, Any] | None = None
    """The last twin check (``TwinCheck.to_dict``)."""


def p99s(s: WindowSummary | None) -> dict[str, float]:
    out = {}
    for p in Priority:  # P2 too: the load sends it, and the timeline draws every class
        per = None if s is None else s.classes[p]
        for k in ("ttft_p99_ms", "tbt_p99_ms"):
            v = None if per is None else getattr(per, k)
            out[f"{p.label}_{k}"] = math.nan if v is None else v
    return out


class Narrator:
    """Prints each line of the story with the time since the start, and keeps it."""

    def __init__(self, console: Console, lines: list[str]) -> None:
        self.console, self.lines = console, lines
        self.t0 = time.time()

    def __call__(self, text: str) -> None:
        line = f"[t+{time.time() - self.t0:5.1f}s] {text}"
        self.lines.append(line)
        self.console.print(line, markup=False, highlight=False)


@dataclass
class Story:
    """What the printout and the result say happened, tick by tick."""

    say: Narrator
    result: DemoResult
    rate_window_s: float
    """The window the SLO is judged over before it counts as restored."""
    alerts: str = ""
    awaiting_restore: bool = False

    def alerts_now(self, firing: list[Alert], elapsed: float) -> None:
        names = ", ".join(a.describe() for a in firing)
        if names != self.alerts:
            self.say(f"ALERT firing: {names}" if names else "alerts resolved")
            if names and self.result.alert_at_s is None:
                self.result.alert_at_s = elapsed
            self.alerts = names

    def decided(self, d: Decision, ctl: Controller, elapsed: float) -> None:
        if d.twin is not None:
            self.result.twin = d.twin
            self.say(twin_line(d.twin))
        if d.action is not Action.NONE or d.summary is not None:
            self.say(describe(d, ctl))
        if d.action is Action.TRIAL:
            self.result.trials += 1
        if d.action is Action.SCALE:
            self.result.scaled = True
        if d.action in (Action.COMMIT, Action.SCALE):
            self.result.commit_at_s = elapsed
            self.awaiting_restore = True

    def window(self, summary: WindowSummary | None, ctl: Controller, firing: list[Alert],
               elapsed: float) -> None:
        if self.awaiting_restore and summary is not None and \
                score(summary, ctl.settings.slo).feasible and not firing:
            self.awaiting_restore = False
            self.result.restored_at_s = elapsed
            self.say("SLO restored: every class within its SLO over the last "
                     f"{self.rate_window_s:g} s, no alert firing")


def describe(d: Decision, ctl: Controller) -> str:
    text = f"{d.action.value.upper():7} state={d.state.value} replicas={d.replicas}: {d.reason}"
    if d.config:
        knobs = {k: d.config[k] for k in ("token_budget", "chunk_size", "max_num_seqs")
                 if k in d.config}
        text += f" | config {knobs}"
    if d.summary:
        p = p99s(d.summary)
        text += (f" | P0 TTFT/TBT P99 {p['p0_ttft_p99_ms']:.0f}/{p['p0_tbt_p99_ms']:.0f} ms, "
                 f"P1 {p['p1_ttft_p99_ms']:.0f}/{p['p1_tbt_p99_ms']:.0f} ms "
                 f"(SLO P0 {ctl.settings.slo.p0.ttft_p99_ms:g}/{ctl.settings.slo.p0.tbt_p99_ms:g})")
    return text


def twin_line(twin: Mapping[str, Any]) -> str:
    """One line of a twin check: trusted or not, step-time and P0 p99 errors."""
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:+.0%}"

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f}"

    text = (f"TWIN    {'trusted' if twin['trusted'] else 'UNTRUSTED'} ({twin['reason']}): "
            f"step time {pct(twin['stepTimeError'])}")
    if twin["correction"] != "none":
        text += f", {pct(twin['correctedStepTimeError'])} after {twin['correction']}"
    p0 = twin["classes"].get("p0")
    if p0:
        # The demo sets no twin_max_latency_error: these are shown, the step times judge.
        text += (f" | P0 TTFT P99 {ms(p0['ttftP99PredictedMs'])} predicted vs "
                 f"{ms(p0['ttftP99MeasuredMs'])} ms measured, TBT P99 "
                 f"{ms(p0['tbtP99PredictedMs'])} vs {ms(p0['tbtP99MeasuredMs'])} ms "
                 "(one window's, not judged)")
    return text
