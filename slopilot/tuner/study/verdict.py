"""The robust verdict: a config judged on every window, and what it misses, in words.

A config holds the SLO only if it holds every term in every window with the headroom
``HEADROOM`` (``holds``, the loop's own rule): its constraint terms are each term's worst
window. The study then ranks by the worst window too: its objective is the smallest
goodput share over the windows (output tokens of requests within their SLO over the
output tokens the window's requests asked for), so that a config cannot buy goodput in
a quiet window with the busy one's headroom; shares, not tokens per second, because the
windows carry different loads. ``goodput_tok_s`` stays the windows' mean (a figure the
study stores and ``Tuner`` reports to Optuna when there is no share, comparable across
trials because each runs the same windows); what is printed beside a window's figures
is that window's own (``deciding_goodput``), and the mean is labelled as the mean.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.objective import NO_SAMPLES, TrialResult, WindowResult, holds


def replicas_text(n: int) -> str:
    """``1 replica``, ``2 replicas``: the report read "The recommendation on 1 replicas"
    and "1 replica(s) with"."""
    return f"{n} replica{'s' if n != 1 else ''}"


def judged_in(results: Sequence[TrialResult]) -> str:
    """Where each of ``results`` was judged, as a plot's label says it: "worst window"
    where any had several windows; else the one window's name (a trace judged whole:
    its plots read "worst window" of the one window there was)."""
    names = {w.name for r in results for w in r.windows}
    if any(len(r.windows) > 1 for r in results) or len(names) > 1:
        return "worst window"
    return names.pop() if names else "its window"


def judged_where(results: Sequence[TrialResult]) -> str:
    """``judged_in`` in a sentence's words: ``its worst window`` where any had several
    windows, ``the whole trace`` (or ``seed 1``, a name) where each had the one, ``its
    window`` without windows. The report's captions and ``tune``'s terminal output both
    read it: the terminal said "worst window" of a trace judged whole."""
    where = judged_in(results)
    if where in ("its window", "worst window"):
        return "its worst window" if where == "worst window" else where
    # A seed is a name ("seed 1"); the rest are a span ("the whole trace").
    return where if where.startswith("seed ") else f"the {where}"


def goodput_share(summary: WindowSummary | None) -> float | None:
    """Goodput over the output tokens asked for; None where the source cannot tell."""
    a = None if summary is None else summary.overall.accounting
    if summary is None or a is None or a.offered_tok_s <= 0:
        return None
    return min(1.0, summary.overall.goodput_tok_s / a.offered_tok_s)


def deciding_window(windows: Sequence[WindowResult]) -> WindowResult:
    """The window whose worst term is the highest: the one a robust verdict reports."""
    return max(windows, key=lambda w: max(w.result.constraints, default=0.0))


def deciding_goodput(result: TrialResult) -> float:
    """The goodput (tok/s) of ``result``'s deciding window, the one its summary, P99s
    and worst term come from; its own where it has no windows (one run)."""
    if not result.windows:
        return result.goodput_tok_s
    return deciding_window(result.windows).result.goodput_tok_s


def robust_verdict(config: Mapping[str, Any], windows: Sequence[WindowResult],
                   margin: float) -> TrialResult:
    """One result from each window's: worst term per term, worst share, mean goodput."""
    if not windows:
        raise ValueError("windows is empty: a verdict needs at least one window")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin={margin!r}: expected a fraction in [0, 1), e.g. 0.1")
    names = windows[0].result.constraint_names
    if any(w.result.constraint_names != names for w in windows):
        raise ValueError("windows were scored against different SLO terms")
    worst = tuple(max(w.result.constraints[i] for w in windows) for i in range(len(names)))
    deciding = deciding_window(windows)
    shares = [s for s in (goodput_share(w.result.summary) for w in windows) if s is not None]
    result = TrialResult(
        config=dict(config),
        goodput_tok_s=sum(w.result.goodput_tok_s for w in windows) / len(windows),
        constraints=worst, feasible=False, summary=deciding.result.summary,
        constraint_names=names, margin=margin,
        objective=min(shares) if shares else None, windows=tuple(windows))
    return dataclasses.replace(result, feasible=holds(result, margin))


# ---------------------------------------------------------------------- in words
@dataclass(frozen=True)
class Violation:
    """One SLO term a config misses (or holds without the headroom), in user units."""

    term: str
    """The constraint's name: ``p1.ttft_p99``, ``preemptions_per_min``."""
    label: str
    """``P1 TTFT p99``."""
    measured: float
    limit: float
    unit: str
    """``ms`` or ``/min``."""
    margin: float
    window: str | None
    """The window where it is worst (``WindowResult.span``); None with one window."""

    @property
    def within_limit(self) -> bool:
        """Within the SLO itself, short only of the headroom."""
        return self.measured <= self.limit

    def text(self) -> str:
        """``P1 TTFT p99 13.4 s against 500 ms (in busiest arrivals: 725-785 s ...)``."""
        out = f"{self.label} {_value(self.measured, self.unit)} against " \
              f"{_value(self.limit, self.unit)}"
        if self.within_limit:
            out += (f" (within it, but not with the {self.margin:.0%} headroom: needs "
                    f"{_value(self.limit * (1 - self.margin), self.unit)})")
        if self.window:
            out += f" (in {self.window})"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"term": self.term, "label": self.label, "measured": self.measured,
                "limit": self.limit, "unit": self.unit, "window": self.window,
                "within_limit": self.within_limit, "text": self.text()}


def _value(v: float, unit: str) -> str:
    if unit == "ms":
        return f"{v / 1000:.1f} s" if v >= 1000 else f"{v:.0f} ms"
    return f"{v:.1f} {unit}"


def term_label(term: str) -> tuple[str, str]:
    """A constraint's name as a person reads it, and its unit."""
    if term == "preemptions_per_min":
        return "preemptions per minute", "/min"
    cls, _, kind = term.partition(".")
    return f"{cls.upper()} {kind.split('_')[0].upper()} p99", "ms"


def share_text(term: str, value: float) -> str:
    """A term's value as a share of its limit (``214%``), ``-`` for a class's P99 that no
    window had a request to measure (a class without traffic has no P99, not 0 %)."""
    if term != "preemptions_per_min" and value == NO_SAMPLES:
        return "-"
    return f"{value + 1:.0%}"


def worst_share(r: TrialResult) -> tuple[str, str | None]:
    """A trial's worst term as the top tables show it: its share of its limit
    (``share_text``: "-" for a class no window measured) and its name (None unnamed);
    ("-", None) for a trial without terms."""
    worst = max(range(len(r.constraints)), key=lambda i: r.constraints[i], default=None)
    if worst is None:
        return "-", None
    if not r.constraint_names:
        return f"{r.constraints[worst] + 1:.0%}", None
    name = r.constraint_names[worst]
    return share_text(name, r.constraints[worst]), name


def term_requests(r: TrialResult, term: str) -> tuple[str, float] | None:
    """The class ``term`` judges (``P0``) and how many of its requests its P99 ranks in
    the window where the term is worst (``ClassFigures.ttft_samples`` where counted,
    else those finished): the sample a P99 rests on, not the window's every class (a
    reviewer read P0's P99 said to rest on 273 requests where P0 had 32). None for a
    term of no class (preemptions) or without a summary."""
    cls, dot, kind = term.partition(".")
    p = next((p for p in Priority if p.label == cls), None)
    if not dot or p is None or term not in r.constraint_names:
        return None
    i = r.constraint_names.index(term)
    s = (max(r.windows, key=lambda w: w.result.constraints[i]).result.summary
         if r.windows else r.summary)
    if s is None:
        return None
    figures = s.classes[p]
    n = (figures.ttft_samples if kind.startswith("ttft") and figures.ttft_samples is not None
         else figures.requests_finished)
    return cls.upper(), n


def term_limit(slo: SLOSpec, term: str) -> float:
    """The limit the SLO sets for ``term``, in its unit (``term_label``)."""
    if term == "preemptions_per_min":
        limit = slo.max_preemptions_per_min
    else:
        cls, _, kind = term.partition(".")
        limit = getattr(slo.class_slo(cls), f"{kind}_ms")
    if limit is None:
        raise ValueError(f"the SLO sets no limit for {term}")
    return float(limit)


def violations(result: TrialResult, slo: SLOSpec) -> list[Violation]:
    """The terms ``result`` misses with its headroom, worst first, each in its worst window."""
    out = []
    for i, term in enumerate(result.constraint_names):
        c = result.constraints[i]
        if c <= -result.margin:
            continue
        window = None
        if result.windows:
            worst = max(result.windows, key=lambda w: w.result.constraints[i])
            window = worst.span
        label, unit = term_label(term)
        limit = term_limit(slo, term)
        out.append(Violation(term, label, (c + 1.0) * limit, limit, unit, result.margin,
                             window))
    return sorted(out, key=lambda v: v.measured / v.limit, reverse=True)


def infeasible_sentence(result: TrialResult, slo: SLOSpec, replicas: int, *,
                        past: bool = False) -> str:
    """One sentence: no config holds (``past``: held, where the verdict is not the
    study's to give: ``tune``'s too many requests too long), and what the least
    violating one misses."""
    missed = violations(result, slo)
    terms = "; ".join(v.text() for v in missed) or "no term (?)"
    return (f"No configuration tried {'held' if past else 'holds'} the SLO on "
            f"{replicas_text(replicas)} "
            f"with {result.margin:.0%} headroom: the closest "
            f"misses {terms}.")
