"""Study reports a person reads: the verdict, what each trial was judged on, the best
trial's figures per window and class, the capacity answer, the commands, the plots.

``write_report`` writes ``report.md`` and the PNGs (``report_plots.py``) into a folder.
``slopilot tune`` passes a ``ReportContext`` (windows, verdict, capacity, commands); the
demo's live study has none, and its report says only what the trials say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from slopilot.engine.sim.profile_file import write_text_atomically
from slopilot.engine.sim.summary_view import COLUMNS, DEFINITIONS, footer, rows
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study import report_plots as plots
from slopilot.tuner.study.importance import importance
from slopilot.tuner.study.objective import TrialResult, score
from slopilot.tuner.study.plot_subject import PlotSubject
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import (
    deciding_goodput,
    goodput_share,
    judged_where,
    replicas_text,
    term_label,
    worst_share,
)

pareto_front = plots.pareto_front


@dataclass(frozen=True)
class ReportContext:
    """What the study cannot know about itself (``slopilot tune`` fills it in)."""

    verdict: str
    judged_on: str
    """``WindowPlan.describe()``: --duration, warm-up, drain and the windows."""
    windows: Sequence[Mapping[str, Any]] = ()
    """Each window: name, start_s, end_s, warmup_s, drain_s, arrival_rate, token_rate."""
    replicas: int = 1
    recommended_replicas: int | None = None
    recommended_config: Mapping[str, Any] | None = None
    capacity: Sequence[str] = ()
    """Lines on the capacity search (empty when none ran)."""
    command: str = ""
    check_command: str | None = None
    timing: str = ""
    recommended_result: TrialResult | None = None
    """The recommendation's own result when it differs from the best trial (the capacity
    search's, at the recommended replica count; the start config's when it is kept)."""
    recommended_note: str | None = None
    """A line above the recommended knobs (``tune``: keep the start config)."""
    recommended_label: str | None = None
    """Whose knobs the recommendation has (``trial 3``, ``the start config``)."""
    best: tuple[str, TrialResult] | None = None
    """The config the verdict names on ``replicas``, its label and result: the start
    config where no trial ranks above it. The report showed the best trial's figures
    under the verdict's start config (rev-trace2 bursty: 324 ms beside 289 ms)."""
    best_trial: int | None = None
    """``best``'s trial number; None where it is not a trial (the start config)."""
    comparison: Sequence[str] = ()
    """The start config beside the best trial, the terminal's table as markdown lines,
    under the recommendation (empty where no trial completed)."""
    extra: Sequence[str] = field(default_factory=tuple)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(getattr(v, "value", v))


def _slo_section(slo: SLOSpec) -> list[str]:
    lines = ["## SLO", "", "| class | TTFT P99 (ms) | TBT P99 (ms) |", "|---|---|---|"]
    for p, c in slo.classes().items():
        lines.append(f"| {p.label} | {_fmt(c.ttft_p99_ms or '-')} | "
                     f"{_fmt(c.tbt_p99_ms or '-')} |")
    return lines + ["", f"Max preemptions per minute: "
                        f"{_fmt(slo.max_preemptions_per_min or '-')}", ""]


def _context_sections(ctx: ReportContext) -> list[str]:
    lines = [f"**{ctx.verdict}**", "", "## What each trial was judged on", "",
             ctx.judged_on[:1].upper() + ctx.judged_on[1:] + ".", ""]
    if ctx.windows:
        lines += ["| window | measured (s) | warm-up (s) | drain (s) | req/s | tok/s |",
                  "|---|---|---|---|---|---|"]
        for w in ctx.windows:
            rate = "-" if w.get("arrival_rate") is None else f"{w['arrival_rate']:.1f}"
            tok = "-" if w.get("token_rate") is None else f"{w['token_rate']:,.0f}"
            lines.append(f"| {w['name']} | {w['start_s']:,.0f}-{w['end_s']:,.0f} | "
                         f"{w['warmup_s']:g} | {w['drain_s']:g} | {rate} | {tok} |")
        lines += ["", "Only requests arriving inside a window count; those unfinished when "
                  "its drain ends enter TTFT at the time they had waited.", ""]
    lines += ["## Recommendation", ""]
    if ctx.recommended_note:
        lines += [ctx.recommended_note, ""]
    if ctx.recommended_replicas is not None and ctx.recommended_config is not None:
        lines += [f"{replicas_text(ctx.recommended_replicas)} with:", "", "| knob | value |",
                  "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in ctx.recommended_config.items()]
        lines.append("")
    else:
        lines += ["None: see the verdict above.", ""]
    if ctx.comparison:
        lines += [*ctx.comparison, ""]
    if ctx.capacity:
        lines += ["## Capacity", "", *ctx.capacity, ""]
    if ctx.check_command:
        lines += ["Check the answer on the whole workload:", "", "```",
                  ctx.check_command, "```", ""]
    if ctx.command:
        lines += ["Reproduce this study:", "", "```", ctx.command, "```", ""]
    # The notes are paragraphs: the last one ran into the heading after it.
    return lines + list(ctx.extra) + ([""] if ctx.extra else [])


def _best_figures(best: TrialResult, slo: SLOSpec,
                  heading: str = "The best trial, per window and class") -> list[str]:
    """Each window's table as ``slopilot simulate`` prints it, with the lines under it."""
    lines = [f"## {heading}", ""]
    windows = [(w.span, w.result) for w in best.windows] or [("the window", best)]
    unfilled: set[str] = set()
    for span, r in windows:
        s = r.summary
        if s is None:
            continue
        share = goodput_share(s)
        gone = _unfilled(s)
        unfilled |= gone
        keep = [i for i, c in enumerate(COLUMNS) if c not in gone]
        lines += [f"**{span}**: goodput {s.overall.goodput_tok_s:,.0f} tok/s"
                  + ("" if share is None else f" ({share:.1%} of the output asked for)"), "",
                  "| " + " | ".join(COLUMNS[i] for i in keep) + " |", "|" + "---|" * len(keep)]
        lines += ["| " + " | ".join(row[i] for i in keep) + " |" for row in rows(s, slo)]
        lines += ["", *(f"{line}." for line in footer(s, definitions=False)), ""]
    if unfilled:
        lines += [", ".join(c for c in COLUMNS if c in unfilled)[:1].upper()
                  + ", ".join(c for c in COLUMNS if c in unfilled)[1:]
                  + " are left out: the live windows count the requests finished and read "
                  "P99s from histograms, not each request's arrival and times.", ""]
    if not best.windows and best.summary is not None and \
            _beyond_its_window(best, best.summary, slo):
        lines += [f"This trial was judged on more than this window (a live trial within "
                  f"the headroom of a limit is confirmed on a second one): its result, "
                  f"goodput {best.goodput_tok_s:,.1f} tok/s and each term the worse "
                  "window's (the top trials and the plots), is not this table's; the "
                  "table is its last window.", ""]
    return lines + [f"{line}." for line in DEFINITIONS] + [""]


_ACCOUNTED = ("arrived", "unfinished", "rejected", "goodput all")
_PER_REQUEST = ("TTFT mean", "max stall")


def _unfilled(summary: WindowSummary) -> set[str]:
    """The table's columns ``summary`` has no figures for: a live window (the demo's
    trials, from Prometheus) has no request accounting and no per-request samples, and
    its table printed six columns of "-" only."""
    gone = set(_ACCOUNTED) if summary.overall.accounting is None else set()
    return gone | (set(_PER_REQUEST) if summary.overall.samples is None else set())


def _beyond_its_window(result: TrialResult, summary: WindowSummary, slo: SLOSpec) -> bool:
    """Whether a one-window result says more than its summary: the loop's two-window
    trial keeps the last window's summary with the worse terms and lower goodput of
    both (``loop/trial_window._with_first_window``), and only that summary is stored."""
    own = score(summary, slo, result.config)
    return (own.goodput_tok_s != result.goodput_tok_s
            or (own.constraint_names == result.constraint_names
                and own.constraints != result.constraints))


def _top(ranked: list[tuple[int, TrialResult]], top: int) -> list[str]:
    """The top trials' table. A study of one window per trial (the demo's live trials)
    has no goodput share (its windows do not count the output asked for) and one goodput,
    not a deciding window's beside the windows' mean: those columns read "-" and the same
    figure twice there, and are left out."""
    shown = ranked[:top]
    shares = any(r.objective is not None for _, r in shown)
    windows = any(r.windows for _, r in shown)
    head = ["trial", "holds SLO", "worst term (share of limit)",
            *(["goodput share"] if shares else []),
            *(["goodput (tok/s, deciding window)", "goodput (tok/s, mean of windows)"]
              if windows else ["goodput (tok/s)"]),
            "token_budget", "chunk_size", "max_num_seqs"]
    lines = [f"## Top {min(top, len(ranked))} trials", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for n, r in shown:
        share, term = worst_share(r)
        where = share if term is None or share == "-" else f"{share} ({term_label(term)[0]})"
        cells = [str(n), "yes" if r.feasible else "no", where]
        if shares:
            cells.append("-" if r.objective is None else f"{r.objective:.1%}")
        cells += [f"{deciding_goodput(r):,.1f}", f"{r.goodput_tok_s:,.1f}"] if windows \
            else [f"{r.goodput_tok_s:,.1f}"]
        cells += [str(r.config.get(k, "-")) for k in ("token_budget", "chunk_size",
                                                      "max_num_seqs")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


PLOTS = ("history.png", "terms.png", "pareto.png", "importance.png")


def report_files(out_dir: Path) -> list[Path]:
    """What ``write_report`` writes, or (a plot it does not draw) removes, in ``out_dir``:
    no input of the run may be one of them."""
    return [out_dir / name for name in ("report.md", *PLOTS)]


def caption(img: str, results: Sequence[tuple[int, TrialResult]],
            start: TrialResult | None, recommended: plots.Recommended | None = None,
            replicas: int | None = None) -> str:
    """What ``img`` shows, naming only what it draws: the demo's live study has no start
    config and asks no headroom, and its report spoke of a star and a dashed line that its
    plots did not have."""
    margin = results[0][1].margin if results else 0.0
    headroom = " (with the headroom)" if margin else ""
    at_start = "" if start is None else (
        " The start config is drawn as the trials are, at the trial axis's \"start\": "
        + ("green, it holds the SLO." if start.feasible else "a red cross, it misses the SLO."))
    star = ""
    if recommended is not None and (img == "pareto.png" or (
            img == "history.png" and recommended.trial is not None)):
        on = "" if replicas is None else \
            f" (the trials ran on {replicas} replica{'s' if replicas != 1 else ''})"
        star = (f" The gold star is the recommendation, {recommended.what()}"
                f"{on}: its goodput share"
                + (" and worst term" if img == "pareto.png" else "")
                + f" in {_judged_in(results)} there.")
    if img == "history.png":
        if any(r.feasible for _, r in results) or (start is not None and start.feasible):
            return (f"The objective per trial; green trials hold the SLO{headroom}, the line "
                    "is the best that holds so far." + at_start + star)
        return (f"The objective per trial; no trial holds the SLO{headroom}, so there is no "
                "best-so-far line." + at_start + star)
    if img == "terms.png":
        return ("What decides feasibility: each class's TTFT and TBT P99 in "
                f"{_judged_in(results)}, per trial, against the SLO (solid)"
                + (" and the headroom line (dashed)" if margin else "") + "." + at_start)
    if img == "pareto.png":
        return ("Goodput against the worst SLO term (as a share of its limit): "
                + ("right of the dashed line a trial lacks the headroom, " if margin else "")
                + "right of the solid one it breaks the SLO."
                + (" The start config is the point named \"start\"." if start is not None
                   else "")
                + " Each other point is named by its trial's number, as in the tables; "
                  "configs that land on one point are named together there." + star)
    return ("How much of the variation in the target each knob explains (fANOVA over these "
            "trials: a rough guide, not a measurement).")


def _judged_in(results: Sequence[tuple[int, TrialResult]]) -> str:
    """``its worst window``, ``the whole trace``: where the plots read each config."""
    return judged_where([r for _, r in results])


def trials_line(tuner: Tuner, results: Sequence[tuple[int, TrialResult]]) -> str:
    """The study's trials as the report's first line: those completed of those started,
    any unfinished named, and any queued (a warm start) told apart. Counted as one, a
    queued trial that never ran read as a trial of the run: the demo's report said "0
    completed trials of 2" where its summary said "1 trial"."""
    trials = tuner.study.get_trials(deepcopy=False)
    queued = sum(1 for t in trials if t.state == TrialState.WAITING)
    unfinished = [t.number for t in trials if t.state == TrialState.RUNNING]
    started = len(trials) - queued
    text = (f"Study `{tuner.study.study_name}`: {len(results)} completed "
            f"trial{'' if len(results) == 1 else 's'} of {started} started")
    if unfinished:
        which = ", ".join(map(str, unfinished))
        text += (f" (trial{'' if len(unfinished) == 1 else 's'} {which} "
                 f"{'was' if len(unfinished) == 1 else 'were'} unfinished when the report "
                 "was written)")
    if queued:
        text += f"; {queued} more queued, never started"
    return text + "."


def write_report(tuner: Tuner, slo: SLOSpec, out_dir: Path, *, subject: PlotSubject,
                 top: int = 10, start: TrialResult | None = None,
                 title: str = "Tuning report", context: ReportContext | None = None,
                 lead: Sequence[str] = (), tail: Sequence[str] = ()) -> Path:
    """Write the PNGs (each naming ``subject``) and ``report.md`` (``lead``'s lines after
    its first, ending in ``tail``'s) into ``out_dir``; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = tuner.results()
    lines = [f"# {title}", "", trials_line(tuner, results), "", *lead]
    if context is not None:
        lines += _context_sections(context)
    if not results:
        lines.append("No completed trials: nothing to plot.")
        _remove_undrawn(out_dir, drawn=[])
        return _write(out_dir, [*lines, *tail])
    ranked = sorted(results, key=lambda nr: rank(nr[1]), reverse=True)
    lines += _slo_section(slo) + _figures(context, ranked[0][1], slo)
    lines += _top(ranked, top) + _not_a_trial(context)
    rec = _recommended(context, results, start)
    images = [plots.history(results, out_dir, start, subject=subject, recommended=rec)]
    term_plot = plots.terms(results, slo, out_dir, start, subject=subject)
    images += [term_plot] if term_plot else []
    images.append(plots.pareto(results, out_dir, start, subject=subject, recommended=rec))
    imp = importance(tuner.study, [r for _, r in results])
    if imp.values:
        images.append(plots.importance_plot(imp.values, imp.target, out_dir,
                                            subject=subject))
    lines += ["## Plots", ""]
    for img in images:
        lines += [f"![{img.removesuffix('.png')}]({img})", "",
                  caption(img, results, start, rec,
                          None if context is None else context.replicas), ""]
    if imp.values is None:
        lines.append(f"Knob importance is left out: {imp.reason}.")
    elif imp.reason:
        lines.append(f"Knob importance, target {imp.target}; {imp.reason}.")
    if context is not None and context.timing:
        lines += ["", f"Time: {context.timing}."]
    _remove_undrawn(out_dir, drawn=images)
    return _write(out_dir, [*lines, *tail])


def _figures(context: ReportContext | None, best_trial: TrialResult,
             slo: SLOSpec) -> list[str]:
    """The recommendation's figures per window and class, then those of the config the
    verdict names on the count tuned at (the best trial where no context names one)."""
    if context is None:
        return _best_figures(best_trial, slo)
    lines, rec = [], context.recommended_result
    on = replicas_text(context.replicas)
    if rec is not None:
        whose = "" if context.recommended_label is None else f" ({context.recommended_label})"
        count = context.recommended_replicas or context.replicas
        lines = _best_figures(rec, slo, heading=f"The recommendation on "
                              f"{replicas_text(count)}{whose}, per window and class")
    if context.best is None:
        return lines + _best_figures(best_trial, slo, heading=(
            f"The best trial, per window and class (on {on})"))
    label, best = context.best
    if rec is not None and context.recommended_replicas == context.replicas and rec == best:
        return lines  # the kept start config: the same table twice
    word = "best" if best.feasible else "closest"
    return lines + _best_figures(best, slo, heading=(
        f"The {word} config on {on} ({label}), per window and class"))


def _not_a_trial(context: ReportContext | None) -> list[str]:
    """Where the verdict's config is the start config, why the top trials' table lacks
    it: its first row read 324 % beside the verdict's 289 % (rev-trace2 bursty)."""
    if context is None or context.best is None or context.best_trial is not None:
        return []
    label, best = context.best
    share, term = worst_share(best)
    where = "its worst term" if term is None else term_label(term)[0]
    return [f"{label[:1].upper()}{label[1:]} is not a trial, so not in this table: no trial "
            f"here ranks above it ({where} at {share} of its limit), and the verdict and the "
            "per-class table above are its.", ""]


def _recommended(context: ReportContext | None, results: Sequence[tuple[int, TrialResult]],
                 start: TrialResult | None) -> plots.Recommended | None:
    """The recommendation where the plots do not draw it: on another replica count than
    the trials (the capacity answer's), at the trial whose knobs it has."""
    if context is None or context.recommended_result is None \
            or context.recommended_replicas in (None, context.replicas):
        return None
    rec = context.recommended_result
    trial = next((n for n, r in results if r.config == rec.config), None)
    if trial is None and start is not None and start.config == rec.config:
        trial = plots.START
    assert context.recommended_replicas is not None
    return plots.Recommended(rec, context.recommended_replicas, trial)


def _remove_undrawn(out_dir: Path, drawn: Sequence[str]) -> None:
    """Remove the plots of an earlier report in ``out_dir`` that this one did not draw:
    re-run into the same folder, a study that draws no importance plot (too few trials)
    left the earlier study's importance.png beside a report.md that no longer links it.
    Only the report's own plot names are touched; any other file there is kept."""
    for name in set(PLOTS) - set(drawn):
        (out_dir / name).unlink(missing_ok=True)


def _write(out_dir: Path, lines: list[str]) -> Path:
    # Beside it, then renamed over it: a crash part-way leaves the earlier report whole,
    # never half of this one.
    return write_text_atomically(out_dir / "report.md", "\n".join(lines) + "\n")
