"""What ``slopilot tune`` prints: tables and the verdict, or one JSON object.

The JSON keys: ``holds`` (the verdict: true where a config and a count that hold the SLO
are recommended, in every window and over the whole trace where it was replayed; false
where nothing is), ``feasible`` (the windows' verdict alone: the best config holds in
every window on ``replicas``, whatever the whole-trace replay then found),
``violations`` (each in user units), ``recommended_replicas``
and ``config`` (what to run), ``changes`` (the knobs ``config`` changes from the start
config; ``{}``: keep it), ``windows`` and ``duration_s`` (what each trial was judged on),
``capacity`` (the search, when one ran), ``best`` (the best config on the replicas tuned
at: a trial or the start config, ``best_candidate`` names it and ``best_trial`` is its
number or null), ``start``, ``top`` (the trials),
``start_fitted`` (the knobs the start config moved to fit --set and --bound), the
``command`` that reproduces the study and the ``check_command`` that replays the whole
workload with the answer, ``whole_trace`` (that replay, run before the verdict where
windows chose the answer: ``holds``, ``replicas``, the fewest it holds on, null where none
up to ``max_replicas`` does, and ``tried``, each count's ``figures``; null otherwise),
``timing``, ``warnings`` (each also on stderr when the study
starts, or, a trace's session pace, once the start config has been replayed),
``too_long`` (a trace's requests too long for one replica, rejected unjudged:
``requests``, ``of``, ``share``, ``limit_tokens``, ``limit``, ``max_share``, the
``--max-too-long`` share, and ``exceeds_max``: ``share`` is above it, and ``holds`` is
false; null for a generated workload).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slopilot.engine.sim.summary_view import GOODPUT_DEFINITION, print_summary, simulate_json
from slopilot.engine.sim.twin import twin_label
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.verdict import (
    deciding_goodput,
    deciding_window,
    goodput_share,
    judged_where,
    replicas_text,
    worst_share,
)
from slopilot.tuner.tune.comparison import comparison, knob_text
from slopilot.tuner.tune.outcome import TuneOutcome


def ranked(outcome: TuneOutcome) -> list[tuple[int, TrialResult]]:
    return sorted(outcome.tuner.results(), key=lambda nr: rank(nr[1]), reverse=True)


def _summary(r: TrialResult, slo: SLOSpec) -> dict[str, Any] | None:
    return None if r.summary is None else simulate_json(r.summary, slo)


def brief(r: TrialResult, slo: SLOSpec) -> dict[str, Any]:
    """A trial's result for the JSON: knobs, verdict, the deciding window's figures
    (``deciding_window``: its span; ``goodput_tok_s``, ``throughput_tok_s``, the P99s and
    ``summary``, all of that one window), the windows' mean goodput
    (``goodput_tok_s_mean``), the lowest window's goodput share (the study's objective),
    and each window's figures as ``simulate --json`` gives them."""
    summary = _summary(r, slo)
    s = summary or {}
    return {"config": dict(r.config), "goodput_tok_s": deciding_goodput(r),
            "goodput_tok_s_mean": r.goodput_tok_s,
            "deciding_window": deciding_window(r.windows).span if r.windows else None,
            "goodput_share_worst_window": r.objective, "feasible": r.feasible,
            "margin": r.margin,
            "constraints": dict(zip(r.constraint_names, r.constraints, strict=True)),
            "throughput_tok_s": s.get("throughput_tok_s"),
            "ttft_p99_ms": s.get("ttft_p99_ms"), "tbt_p99_ms": s.get("tbt_p99_ms"),
            "classes": {c: {k: v.get(k) for k in ("ttft_p99_ms", "tbt_p99_ms",
                                                   "goodput_tok_s", "slo_attainment")}
                        for c, v in (s.get("classes") or {}).items()},
            "summary": summary,
            "windows": [{"name": w.name, "span": w.span, "feasible": w.result.feasible,
                         "goodput_tok_s": w.result.goodput_tok_s,
                         "goodput_share": goodput_share(w.result.summary),
                         "constraints": dict(zip(r.constraint_names, w.result.constraints,
                                                 strict=True)),
                         "summary": _summary(w.result, slo)}
                        for w in r.windows]}


def as_dict(outcome: TuneOutcome, report: Path | None) -> dict[str, Any]:
    s, best = outcome.settings, outcome.best
    slo = s.scenario.slo
    return {
        "scenario": s.scenario.name, "twin": twin_label(s.scenario), "study": s.study_name,
        "sampler": s.sampler,
        "trials": len(outcome.tuner.study.trials), "replicas": s.replicas,
        "duration_s": outcome.plan.windows[0].length_s, "windows_kind": outcome.plan.kind,
        "windows": [dataclasses.asdict(w) for w in outcome.plan.windows],
        "judged_on": outcome.plan.describe(), "margin": outcome.start.margin,
        "feasible": outcome.feasible, "holds": outcome.holds, "verdict": outcome.sentence,
        "violations": [v.to_dict() for v in outcome.violations],
        "recommended_replicas": outcome.recommended_replicas,
        "config": None if outcome.config is None else dict(outcome.config),
        "capacity": None if outcome.capacity is None else outcome.capacity.to_dict(),
        "changes": None if outcome.changes is None else dict(outcome.changes),
        "best_trial": best.trial, "best_candidate": best.label,
        "best": brief(best.result, slo), "start": brief(outcome.start, slo),
        "start_fitted": s.start.fitted_dict(),
        "top": [{"trial": n, **brief(r, slo)} for n, r in ranked(outcome)[:10]],
        "command": outcome.command, "check_command": outcome.check_command,
        "timing": outcome.timing.to_dict(), "warnings": list(outcome.warnings),
        "whole_trace": None if outcome.whole is None else outcome.whole.to_dict(),
        "too_long": None if s.too_long is None else {
            **s.too_long.to_dict(), "max_share": s.max_too_long,
            "exceeds_max": s.too_long.exceeds(s.max_too_long)},
        "report": str(report) if report else None,
    }


def print_json(outcome: TuneOutcome, report: Path | None) -> None:
    print(json.dumps(as_dict(outcome, report), default=str))


def top_row(n: int, r: TrialResult) -> list[str]:
    """Trial ``n``'s row of the top-trials table; a worst term without samples is "-" (a
    class no window had a request of has no share of its limit, not 0 %)."""
    return [str(n), "yes" if r.feasible else "no", worst_share(r)[0],
            "-" if r.objective is None else f"{r.objective:.1%}",
            f"{deciding_goodput(r):,.0f}", f"{r.goodput_tok_s:,.0f}",
            str(r.config.get("token_budget")),
            str(r.config.get("chunk_size")), str(r.config.get("max_num_seqs")),
            str(r.config.get("preemption_mode"))]


def print_text(outcome: TuneOutcome, report: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 180)
    order = ranked(outcome)
    # "its worst window", or the one window each was judged on (a trace judged whole).
    where = judged_where([outcome.start, *(r for _, r in order)])
    top = Table(title=f"Top trials (each judged on {where})")
    for col in ("trial", "holds SLO", "worst term", "goodput share",
                "goodput tok/s, deciding window", "goodput tok/s, mean of windows",
                "budget", "chunk", "max seqs", "mode"):
        top.add_column(col, justify="right")
    for n, r in order[:10]:
        top.add_row(*top_row(n, r))
    console.print(top)
    deciding = ("the worst window (the deciding window: the one whose worst term is "
                "highest)" if where == "its worst window" else where)
    console.print(f"worst term: the SLO term closest to (or over) its limit in {deciding}, "
                  f"as a share of the limit (holding needs at most "
                  f"{1 - outcome.start.margin:.0%}); goodput share: the lowest over the "
                  "windows of output tokens within SLO over those asked for (what the study "
                  "maximizes); goodput tok/s: the deciding window's, and the mean over the "
                  "windows", highlight=False)
    _comparison(console, outcome)
    table = _deciding_window(console, outcome)
    fitted = outcome.settings.start.note()
    if fitted is not None:
        console.print(fitted, highlight=False)
    console.print(f"windows: {outcome.plan.describe()}", highlight=False)
    # The window's table, when printed, has the goodput line and (from its run) the twin's.
    if table is None or table.run is None or not table.run.twin:
        console.print(f"twin: {twin_label(outcome.settings.scenario)}", highlight=False)
    if table is None:
        console.print(GOODPUT_DEFINITION, highlight=False)
    console.print(f"[bold]{outcome.sentence}[/]", highlight=False)
    if outcome.recommended_replicas is not None and outcome.config is not None:
        console.print(_recommended(outcome, outcome.recommended_replicas, outcome.config),
                      highlight=False)
    if outcome.check_command:
        console.print(f"check it on the whole workload: {outcome.check_command}",
                      highlight=False)
    console.print(f"reproduce: {outcome.command}", highlight=False)
    console.print(f"time: {outcome.timing.line()}", highlight=False)
    if report:
        console.print(f"report: {report}")


def _recommended(outcome: TuneOutcome, replicas: int, config: Mapping[str, Any]) -> str:
    if outcome.changes:
        return (f"recommended: {replicas_text(replicas)} with "
                + " ".join(f"{k}={knob_text(v)}" for k, v in config.items()
                           if k in outcome.tuner.space.bounds))
    if replicas == outcome.settings.replicas:
        return (f"recommended: keep the start config on {replicas_text(replicas)}: no knob "
                "changes")
    return f"recommended: {replicas_text(replicas)} with the start config: no knob changes"


def _comparison(console: Any, outcome: TuneOutcome) -> None:
    """The start config beside the best trial (``comparison.py``: the report's too)."""
    from rich.table import Table

    table = comparison(outcome)
    if table is None:
        return
    cmp = Table(title=table.title)
    for col in table.columns:
        cmp.add_column(col, justify="right")
    for row in table.rows:
        cmp.add_row(*row)
    console.print(cmp)


def _deciding_window(console: Any, outcome: TuneOutcome) -> WindowSummary | None:
    """The best config's deciding window as ``simulate`` shows a run: every class's
    requests, censored TTFTs, rejections, both goodputs, busy per replica; the summary
    printed, or None without one."""
    best = outcome.best.result
    name = "Start config" if outcome.best.is_start else f"Best trial ({outcome.best.trial})"
    summary, where = best.summary, "its window"
    if best.windows:
        w = deciding_window(best.windows)
        # One window names itself in its span ("whole trace: 0-6 s ..."); of several, it
        # is the worst.
        within = judged_where([best])
        span = w.span if within == "its worst window" else w.span.partition(": ")[2] or w.span
        summary, where = w.result.summary, f"{within}, {span}"
    if summary is not None:
        print_summary(summary, outcome.settings.scenario.slo, console=console,
                      title=f"{name} on {where}, "
                            f"{replicas_text(outcome.settings.replicas)}")
    return summary
