"""The demo's episodes: alert -> trials -> commit (or scale) -> SLO restored, or missed.

An episode opens at the first trial (or scale) after the last one acted, under the
alerts firing then; it acts once (a commit of a trial's config, a scale, or a hold of
the starting config when nothing held) and is then watched (``RestoreWatch``) until the
next episode opens or the run ends. Each one keeps its own times: the summary and the
report tell them per episode, as printed, never the first episode's alert beside the
last one's commit.

"SLO restored" is a claim about what the episode committed, so it rests on windows of
that config alone: each trailing window starts at or after the tick that applied it
returned, holds every class's SLO on at least ``min_requests`` finished requests (with a
sample of each class the alert was about), no alert fires, and such windows follow one
another for ``hold_s``. A later window that misses takes the claim back ("missed
again"); a new unbroken hold restores it again. A window with too few requests, or
none of the alert's class, is no verdict either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.objective import score, unmeasured
from slopilot.tuner.study.verdict import violations

_EARLY_S = 1e-6  # a window starting at the commit's own time is after it


def t(at_s: float) -> str:
    """A time since the start as the printed lines show it."""
    return f"t+{at_s:.1f}s"


def counts(summary: WindowSummary, classes: tuple[str, ...] = ()) -> str:
    """What a window's P99s rest on: its finished requests, per class where asked."""
    text = f"{summary.overall.requests_finished:.0f} finished requests"
    per = [f"{c.upper()} {summary.classes[Priority.parse(c)].requests_finished:.0f}"
           for c in classes]
    return text + (f", {', '.join(per)}" if per else "")


@dataclass(frozen=True)
class Verdict:
    kind: str
    """``restored`` or ``missed``."""
    at_s: float
    text: str


@dataclass
class RestoreWatch:
    """Whether what one episode committed holds the SLO; see the module docstring."""

    slo: SLOSpec
    since_s: float
    """When the commit (or scale) took effect: no window starting before it is judged."""
    action: str
    episode: int
    window_s: float
    hold_s: float
    min_requests: int
    classes: tuple[str, ...]
    """The classes the episode's alerts were about: each window needs a sample of each."""
    restored_at_s: float | None = None
    """When the current restore was said; None while not restored."""
    _first_end: float | None = None
    _windows: int = 0
    _least: float = math.inf
    _least_class: dict[str, float] = field(default_factory=dict)

    def window(self, summary: WindowSummary | None, firing: bool, start_s: float,
               end_s: float) -> Verdict | None:
        if start_s < self.since_s - _EARLY_S or summary is None or not self._counts(summary):
            return None
        result = score(summary, self.slo)
        if not result.feasible:
            self._reset()
            if self.restored_at_s is None:
                return None  # not restored yet: the hold starts again, nothing to take back
            withdrawn, self.restored_at_s = self.restored_at_s, None
            worst = violations(result, self.slo)[0]
            return Verdict("missed", end_s, (
                f"SLO missed again (episode {self.episode}): {worst.label} "
                f"{worst.measured:.0f} {worst.unit} > {worst.limit:g} {worst.unit} in the "
                f"{self.window_s:g} s window ending {t(end_s)} "
                f"({counts(summary, self.classes)}); the restore at {t(withdrawn)} is "
                "withdrawn"))
        if firing:
            self._reset()
            return None
        if self._first_end is None:
            self._first_end = end_s
        self._windows += 1
        self._least = min(self._least, summary.overall.requests_finished)
        for c in self.classes:
            n = summary.classes[Priority.parse(c)].requests_finished
            self._least_class[c] = min(self._least_class.get(c, math.inf), n)
        if self.restored_at_s is not None or end_s - self._first_end < self.hold_s - _EARLY_S:
            return None
        self.restored_at_s = end_s
        least = "".join(f", {c.upper()} at least {n:.0f}"
                        for c, n in self._least_class.items())
        return Verdict("restored", end_s, (
            f"SLO restored (episode {self.episode}): every class within its SLO and no "
            f"alert firing in each of the {self._windows} windows of {self.window_s:g} s "
            f"ending {t(self._first_end)} to {t(end_s)} ({end_s - self._first_end:.1f} s), "
            f"all after the {self.action} at {t(self.since_s)}; each window on at least "
            f"{self._least:.0f} finished requests{least}"))

    def _counts(self, summary: WindowSummary) -> bool:
        """Whether the window is a verdict: enough requests, the alert's classes in it."""
        if summary.overall.requests_finished < self.min_requests:
            return False
        absent = unmeasured(summary, self.slo)
        return not any(c in absent for c in self.classes)

    def _reset(self) -> None:
        self._first_end, self._windows = None, 0
        self._least, self._least_class = math.inf, {}


@dataclass
class Episode:
    number: int
    opened_at_s: float
    alert_at_s: float | None
    """When the alerts it opened under were first printed (None: none was firing)."""
    alerts: str
    classes: tuple[str, ...]
    trials: list[int] = field(default_factory=list)
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    action: str | None = None
    """``commit``, ``scale`` or ``hold`` (nothing held: the starting config kept)."""
    action_at_s: float | None = None
    config: dict[str, Any] | None = None
    """What a commit applied to every replica."""
    committed_trial: int | None = None
    replicas: int | None = None
    evidence: str | None = None
    """What the commit's window rested on (``counts``)."""
    verdicts: list[Verdict] = field(default_factory=list)
    watch: RestoreWatch | None = None
    closed: str | None = None
    """What ended the watch: the next episode's opening, or the run's end."""
    closed_at_s: float | None = None
    needs_s: float = 0.0
    """How long after the action a restore can first be said (a window, then the hold)."""
    machine_busy: list[tuple[float, float]] = field(default_factory=list)
    """The spans the machine was busy in while this episode's alert and trials ran."""

    def acted(self, action: str, at_s: float, config: Mapping[str, Any] | None,
              replicas: int) -> None:
        self.action, self.action_at_s, self.replicas = action, at_s, replicas
        if config is not None and action == "commit":
            self.config = dict(config)
            self.committed_trial = next((n for n, c in self.configs.items()
                                         if c == self.config), None)

    def close(self, why: str, at_s: float) -> None:
        if self.closed is None:
            self.closed, self.closed_at_s = why, at_s

    def describe(self) -> str:
        alert = (f"alert {self.alerts} at {t(self.alert_at_s)}" if self.alert_at_s is not None
                 else "no alert firing")
        parts = [f"episode {self.number}: {alert}"]
        if self.trials:
            parts.append(f"trial{'s' if len(self.trials) > 1 else ''} "
                         + ", ".join(str(n) for n in self.trials))
        parts.append(self._action())
        text = "; ".join(parts)
        if self.watch is not None:
            text += "; " + self._status()
        if self.machine_busy:
            spans = ", ".join(f"{t(a)} to {t(b)}" for a, b in self.machine_busy)
            text += (f"; the machine was busy meanwhile ({spans}): this episode may answer "
                     "the machine's load, not the workload's")
        return text

    def _action(self) -> str:
        if self.action is None:
            return f"no commit nor scale by {self._closed()}"
        when = t(self.action_at_s or 0.0)
        if self.action == "hold":
            return f"nothing held: the starting config kept at {when}"
        if self.action == "scale":
            return f"scaled to {self.replicas} replicas at {when}"
        which = ("" if self.committed_trial is None
                 else f" of trial {self.committed_trial}")
        evidence = "" if self.evidence is None else f" (its window: {self.evidence})"
        return f"commit{which} at {when}{evidence}"

    def _closed(self) -> str:
        if self.closed is None or self.closed_at_s is None:
            return "the end"
        return f"{self.closed} at {t(self.closed_at_s)}"

    def _status(self) -> str:
        if not self.verdicts:
            text = f"SLO not restored by {self._closed()}"
            since, end = self.action_at_s or 0.0, self.closed_at_s
            if end is not None and end - since < self.needs_s:
                text += (f" (a restore needs {self.needs_s:g} s of windows after the "
                         f"{self.action}; the run gave it {round(end - since, 1):g} s)")
            return text
        told = []
        for v in self.verdicts:
            what = "missed again" if v.kind == "missed" else "restored"
            told.append(f"{what} at {t(v.at_s)}")
        tail = ("held until" if self.verdicts[-1].kind == "restored"
                else "not restored again by")
        return "SLO " + ", ".join(told) + f", {tail} {self._closed()}"
