"""What the demo prints and reports while its loop runs: the story, line by line.

Every line is timestamped from the start (``Narrator``) and kept for the report; ``Story``
turns each tick's alerts, decision and window into lines and into the ``DemoResult``
the command's caller reads: the episodes (``demo_episodes.py``), each with its own alert,
trials, commit and whether the SLO was restored after it. The times a line prints and
the times the result keeps are the same numbers: the loop passes each event's time,
taken after the tick that made it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.local.demo_episodes import Episode, RestoreWatch, counts
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.ports import AlertReader
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import ALL_CLASSES, Alert


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
    """When the first alert line printed."""
    trials: int = 0
    episodes: list[Episode] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    twin: Mapping[str, Any] | None = None
    """The last twin check (``TwinCheck.to_dict``)."""
    machine: list[str] = field(default_factory=list)
    """What the machine's load was during the run, in lines (``machine_load.py``)."""
    machine_busy: bool = False
    stopped_at_s: float | None = None
    """When Ctrl-C or SIGTERM stopped the loop (seconds into the run); None: it ran its
    course."""
    stopped_by: str = ""
    """``Ctrl-C`` or ``SIGTERM``, where one came (``demo_stops.py``); empty: none."""
    report_written: bool = False

    def committed(self) -> tuple[Episode, dict[str, Any]] | None:
        """The last commit's episode and config: what the replicas ended on, unless a
        later scale or hold only added replicas or kept it."""
        for e in reversed(self.episodes):
            if e.action == "commit" and e.config is not None:
                return e, e.config
        return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_lines(result: DemoResult) -> list[str]:
    """The command's closing summary: each episode on its own line, as printed."""
    episodes = (_plural(len(result.episodes), "episode") if result.episodes
                else "no episode (no trial, commit or scale)")
    if result.stopped_by and not result.report_written:
        return [f"stopped by {result.stopped_by} before the report was written: no report"]
    # "started", as the report's first line counts them: a warm start queued but never
    # run is not one, and a trial cut by the end of the run is.
    lines = [f"summary: {episodes}, {_plural(result.trials, 'trial')} started; report "
             f"{result.report}"]
    if result.stopped_at_s is not None:
        lines.append(f"  stopped by {result.stopped_by} at t+{result.stopped_at_s:.1f}s: the "
                     "run up to then")
    elif result.stopped_by:
        lines.append(f"  stopped by {result.stopped_by} once the run was over: the report "
                     "was written first")
    lines += [f"  {e.describe()}" for e in result.episodes]
    if result.episodes:
        lines.append(f"  {ended_on(result)}")
    lines += [f"  {line}" for line in result.machine]
    return lines


def ended_on(result: DemoResult) -> str:
    """Which config the replicas ended on, and from which episode."""
    committed = result.committed()
    if committed is None:
        return "ended on the starting config: nothing was committed"
    episode, config = committed
    which = ("a config" if episode.committed_trial is None
             else f"trial {episode.committed_trial}'s config")
    return (f"ended committed: {which} {knobs(config)}, committed at "
            f"t+{episode.action_at_s or 0.0:.1f}s in episode {episode.number}")


def knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs the demo's lines show of a config."""
    return {k: config[k] for k in ("token_budget", "chunk_size", "max_num_seqs")
            if k in config}


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

    def __init__(self, console: Console, lines: list[str], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.console, self.lines, self.clock = console, lines, clock
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def __call__(self, text: str, *, at: float | None = None) -> None:
        """Print ``text`` at ``at`` seconds since the start (None: now)."""
        line = f"[t+{self.elapsed() if at is None else at:5.1f}s] {text}"
        self.lines.append(line)
        self.console.print(line, markup=False, highlight=False)


@dataclass
class Story:
    """What the printout and the result say happened, tick by tick.

    ``rate_window_s``: the trailing window each tick's figures are over; ``hold_s``,
    ``min_requests``: the restore rule (``demo_episodes.py``)."""

    say: Narrator
    result: DemoResult
    slo: SLOSpec
    rate_window_s: float
    hold_s: float
    min_requests: int
    alerts: str = ""
    alert_since_s: float | None = None
    firing: list[Alert] = field(default_factory=list)

    def alerts_now(self, firing: list[Alert], at_s: float) -> None:
        self.firing = list(firing)
        names = ", ".join(a.describe() for a in firing)
        if names != self.alerts:
            self.say(f"ALERT firing: {names}" if names else "alerts resolved", at=at_s)
            if names and self.result.alert_at_s is None:
                self.result.alert_at_s = at_s
            if names and not self.alerts:
                self.alert_since_s = at_s
            elif not names:
                self.alert_since_s = None
            self.alerts = names

    @property
    def _open(self) -> Episode | None:
        """The episode that has not acted yet, if one has opened."""
        last = self.result.episodes[-1] if self.result.episodes else None
        return last if last is not None and last.action is None else None

    def _episode(self, at_s: float) -> Episode:
        """The open episode, or a new one (ending the watch of the one before)."""
        if (open_ := self._open) is not None:
            return open_
        episodes = self.result.episodes
        n = len(episodes) + 1
        if episodes:
            episodes[-1].close(f"episode {n} opened", at_s)
        classes = tuple(sorted({a.priority_class for a in self.firing
                                if a.priority_class != ALL_CLASSES}))
        episode = Episode(n, at_s, self.alert_since_s, self.alerts or "-", classes,
                          needs_s=self.rate_window_s + self.hold_s)
        episodes.append(episode)
        return episode

    def decided(self, d: Decision, ctl: Controller, at_s: float) -> None:
        if d.twin is not None:
            self.result.twin = d.twin
            self.say(twin_line(d.twin), at=at_s)
        if d.action is not Action.NONE or d.summary is not None:
            self.say(describe(d, ctl), at=at_s)
        if d.action is Action.TRIAL:
            self.result.trials += 1
            episode = self._episode(at_s)
            if d.trial is not None:
                episode.trials.append(d.trial)
                episode.configs[d.trial] = dict(d.config or {})
        elif d.action in (Action.COMMIT, Action.SCALE):
            episode = self._episode(at_s)
            episode.acted(d.action.value, at_s, d.config, d.replicas)
            if d.summary is not None:
                episode.evidence = counts(d.summary, episode.classes or ("p0",))
            episode.watch = RestoreWatch(
                self.slo, at_s, d.action.value, episode.number, self.rate_window_s,
                self.hold_s, self.min_requests, episode.classes)
        elif d.action is Action.HOLD and d.state is ControllerState.COOLDOWN and \
                (episode_ := self._open) is not None:
            episode_.acted("hold", at_s, None, d.replicas)

    def window(self, summary: WindowSummary | None, firing: list[Alert], start_s: float,
               end_s: float) -> None:
        """The trailing window ``[start_s, end_s]`` (seconds since the start) measured
        after the tick: judged for the last episode that committed or scaled."""
        episode = self.result.episodes[-1] if self.result.episodes else None
        if episode is None or episode.watch is None or episode.closed is not None:
            return
        verdict = episode.watch.window(summary, bool(firing), start_s, end_s)
        if verdict is not None:
            episode.verdicts.append(verdict)
            self.say(verdict.text, at=verdict.at_s)

    def finish(self, at_s: float, busy: Sequence[tuple[float, float]] = ()) -> None:
        """The run ended at ``at_s``; ``busy``: the spans the machine was busy in."""
        for e in self.result.episodes:
            e.close("the end of the run", at_s)
            start = (e.alert_at_s if e.alert_at_s is not None else e.opened_at_s) \
                - self.rate_window_s
            end = e.action_at_s if e.action_at_s is not None else at_s
            e.machine_busy = [(a, b) for a, b in busy if a < end and b > start]


def describe(d: Decision, ctl: Controller) -> str:
    text = f"{d.action.value.upper():7} state={d.state.value} replicas={d.replicas}: {d.reason}"
    if d.config:
        text += f" | config {knobs(d.config)}"
    if d.summary:
        p = p99s(d.summary)
        text += (f" | P0 TTFT/TBT P99 {p['p0_ttft_p99_ms']:.0f}/{p['p0_tbt_p99_ms']:.0f} ms, "
                 f"P1 {p['p1_ttft_p99_ms']:.0f}/{p['p1_tbt_p99_ms']:.0f} ms "
                 f"(SLO P0 {ctl.settings.slo.p0.ttft_p99_ms:g}/{ctl.settings.slo.p0.tbt_p99_ms:g})")
        # A P99 of a few requests is nearly their maximum: say how many it is of.
        per = ", ".join(f"{q.label.upper()} {d.summary.classes[q].requests_finished:.0f}"
                        for q in Priority)
        text += (f" | {d.summary.overall.requests_finished:.0f} requests finished in the "
                 f"window ({per})")
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
