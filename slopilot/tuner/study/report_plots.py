"""The report's plots (matplotlib's Agg backend: no display needed).

- ``history.png``: the objective per trial, the best that holds the SLO so far;
- ``terms.png``: what decides feasibility, per trial: each class's TTFT and TBT P99 (its
  worst window; the window's name where each config had one) against its SLO line and
  the line the headroom asks for;
- ``pareto.png``: goodput against the worst SLO term (a share of its limit): the two
  axes every trial moves on, where a trace replay fixes the throughput;
- ``importance.png``: the knobs' share of the variation (``importance.py``), in their
  user names, only when it means something.

Each names its ``PlotSubject`` (workload, twin and replica count, run) in its suptitle.

Where the run has a start config (``tune``'s), the per-trial plots draw it where they
draw the trials, at x ``START`` (ticked "start"), in the colour and marker of its
outcome: it is a candidate ranked with them and may be the recommendation.

Where ``tune`` recommends a config on more replicas than the study ran on (the capacity
answer), the history and the Pareto plot draw that recommendation too, a star at its
knobs' trial and named with its replica count: rep4 recommended trial 2's knobs on 12
replicas, and neither plot showed it. Configs on one point (rep4: five at a goodput share
of 0) are named together, and a goodput-share axis whose points all lie within a hair
spans 0 to 1 (it read -0.04 to 0.04, a share of 0 as noise around nothing).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slopilot.engine.sim.profile_file import write_bytes_atomically
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import NO_SAMPLES, TrialResult
from slopilot.tuner.study.plot_subject import PlotSubject, name_figure
from slopilot.tuner.study.verdict import judged_in, replicas_text, term_label

Results = Sequence[tuple[int, TrialResult]]

START = -1
"""The start config's place on the trial axes: before trial 0."""


@dataclass(frozen=True)
class Recommended:
    """The recommendation where it is not one of the drawn points: its knobs' result on
    the ``replicas`` it is recommended on."""

    result: TrialResult
    replicas: int
    trial: int | None
    """The trial whose knobs it has (``START``: the start config's); None: none drawn."""

    def what(self) -> str:
        """``trial 2's knobs on 12 replicas``."""
        knobs = "the start config's" if self.trial == START else (
            "its" if self.trial is None else f"trial {self.trial}'s")
        return f"{knobs} knobs on {replicas_text(self.replicas)}"

    def label(self) -> str:
        return f"recommended: {self.what()}"


def _draw_recommended(ax: Any, x: float, y: float, rec: Recommended) -> None:
    ax.scatter([x], [y], marker="*", s=160, c="gold", edgecolors="black", linewidths=0.8,
               zorder=5, label=rec.label())


def _share_axis(ax: Any, values: Sequence[float], share: bool) -> None:
    """A goodput share's axis spans 0 to 1 where its points lie within a hair of each
    other: matplotlib's own -0.04 to 0.04 around five zeros read as noise."""
    if share and values and max(values) - min(values) < 0.05:
        ax.set_ylim(min(-0.05, min(values) - 0.05), max(1.05, max(values) + 0.05))


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig: Any, target: Path, *, dpi: int) -> None:
    """Draw ``fig`` into ``target`` whole or not at all, and close it."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        _pyplot().close(fig)
    # Rendered in memory, then beside the file and renamed over it: a crash or a full
    # disk part-way leaves the earlier plot whole, never half a PNG.
    write_bytes_atomically(target, buf.getvalue())


def objective_label(results: Results) -> str:
    if any(r.objective is not None for _, r in results):
        # A trace judged whole has one window: "worst window" read as if it had more.
        return f"goodput share, {judged_in([r for _, r in results])}"
    return "goodput (tok/s)"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (maximize x, minimize y), sorted by x."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y)
                        for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _split(results: Results) -> tuple[Results, Results]:
    return [nr for nr in results if nr[1].feasible], [nr for nr in results if not nr[1].feasible]


def _with_start(results: Results, start: TrialResult | None) -> Results:
    """The trials with the start config first, at ``START``."""
    return list(results) if start is None else [(START, start), *results]


def _trials(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:6])
    more = f" and {len(numbers) - 6} more" if len(numbers) > 6 else ""
    return f"trial{'s' if len(numbers) > 1 else ''} {shown}{more}"


def _whole_trials(ax: Any, start: bool = False) -> None:
    """Trial numbers are whole: with one or two trials matplotlib's own ticks read
    -0.04 ... 0.04. With ``start``, the tick at ``START`` reads "start" (it read "-1")."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    lo, hi = ax.get_xlim()
    mid = (lo + hi) / 2
    ax.set_xlim(min(lo, mid - 1), max(hi, mid + 1))  # room for a whole number either side
    if not start:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        return
    lo, hi = ax.get_xlim()
    # Rounded and once each: over less than a unit MaxNLocator still ticks 0, 0.1, ...
    # (each read "0").
    trials = sorted({round(t) for t in MaxNLocator(integer=True).tick_values(max(lo, 0), hi)
                     if 0 <= round(t) <= hi})
    if len(trials) > 1 and trials[1] - trials[0] > 2:
        trials = trials[1:]  # "start" and "0", a unit apart on a long axis, overprint
    ax.set_xticks([START, *trials])
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _: "start" if round(x) == START else f"{x:.0f}"))


def history(results: Results, out: Path, start: TrialResult | None = None, *,
            subject: PlotSubject, recommended: Recommended | None = None) -> str:
    fig = history_figure(results, start=start, subject=subject, recommended=recommended)
    save(fig, out / "history.png", dpi=100)
    return "history.png"


def history_figure(results: Results, *, start: TrialResult | None = None,
                   subject: PlotSubject, recommended: Recommended | None = None) -> Any:
    """The objective per trial and the best that holds so far, from the start config on
    (when given); where none holds, the plot says so, and its legend names only what it
    draws."""
    plt = _pyplot()
    trials = results
    results = _with_start(results, start)
    ok, bad = _split(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    if ok:
        ax.scatter([n for n, _ in ok], [r.value for _, r in ok], c="tab:green",
                   label="holds the SLO")
    if bad:
        ax.scatter([n for n, _ in bad], [r.value for _, r in bad], c="tab:red",
                   marker="x", label="misses the SLO")
    if ok:
        best, running = [], -math.inf
        for _, r in results:
            if r.feasible:
                running = max(running, r.value)
            best.append(running if math.isfinite(running) else math.nan)
        ax.step([n for n, _ in results], best, where="post", c="black",
                label="best that holds, so far")
    values = [r.value for _, r in results]
    if recommended is not None and recommended.trial is not None:
        _draw_recommended(ax, recommended.trial, recommended.result.value, recommended)
        values.append(recommended.result.value)
    title = "Trial history" if ok else "Trial history: no trial holds the SLO"
    if not ok and start is not None:
        title = "Trial history: neither the start config nor any trial holds the SLO"
    ax.set(xlabel="trial", ylabel=objective_label(trials), title=title)
    _share_axis(ax, values, share=any(r.objective is not None for _, r in trials))
    _whole_trials(ax, start=start is not None)
    ax.legend(loc="best")
    name_figure(fig, subject)
    fig.tight_layout()
    return fig


def _limits(slo: SLOSpec) -> dict[str, float]:
    out = {}
    for p, c in slo.classes().items():
        if c.ttft_p99_ms is not None:
            out[f"{p.label}.ttft_p99"] = c.ttft_p99_ms
        if c.tbt_p99_ms is not None:
            out[f"{p.label}.tbt_p99"] = c.tbt_p99_ms
    return out


def terms(results: Results, slo: SLOSpec, out: Path, start: TrialResult | None = None, *,
          subject: PlotSubject) -> str | None:
    """Each latency term per trial against its SLO; None when no trial has terms."""
    fig = terms_figure(results, slo, start, subject=subject)
    if fig is None:
        return None
    save(fig, out / "terms.png", dpi=100)
    return "terms.png"


def terms_figure(results: Results, slo: SLOSpec, start: TrialResult | None = None, *,
                 subject: PlotSubject) -> Any:
    """The figure ``terms`` draws, or None when no trial has a latency term."""
    plt = _pyplot()
    limits = _limits(slo)
    first = results[0][1].constraint_names if results else ()
    # A class without traffic in every trial has no P99 to draw (NO_SAMPLES).
    names = [n for n in first if n in limits and any(
        r.constraints[first.index(n)] != NO_SAMPLES for _, r in results)]
    if not names:
        return None
    cols = 2
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    margin = results[0][1].margin
    trials = results
    if start is not None and start.constraint_names != first:
        start = None  # its terms are not the trials' (another SLO): nothing to compare
    results = _with_start(results, start)
    ok, bad = _split(results)
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        i = results[0][1].constraint_names.index(name)
        limit = limits[name]

        def ms(r: TrialResult, i: int = i, limit: float = limit) -> float:
            return (r.constraints[i] + 1.0) * limit

        def measured(rs: Results, i: int = i) -> Results:
            # A trial whose windows had no sample of this term has no P99 to draw; drawn
            # at 0 (0.1 % of the limit on a log axis) it read as the study's best.
            return [nr for nr in rs if nr[1].constraints[i] != NO_SAMPLES]

        # The legend (the first panel's) names only what is drawn: the outcome series
        # are drawn on every panel, empty where no trial of them measured the term.
        if ok:
            ax.scatter([n for n, _ in measured(ok)], [ms(r) for _, r in measured(ok)],
                       c="tab:green", s=18, label="holds the SLO")
        if bad:
            ax.scatter([n for n, _ in measured(bad)], [ms(r) for _, r in measured(bad)],
                       c="tab:red", marker="x", s=18,
                       # The trial's outcome, drawn on every term's panel: a cross under
                       # a panel's line missed on another term.
                       label="misses the SLO (on this term or another)")
        ax.axhline(limit, c="black", lw=1, label=f"SLO {limit:g} ms")
        ax.text(0.01, limit, f" {limit:g} ms", transform=ax.get_yaxis_transform(),
                va="bottom", fontsize=7)
        if margin:
            ax.axhline(limit * (1 - margin), c="black", lw=1, ls="--",
                       label=f"with {margin:.0%} headroom")
        values = [ms(r) for _, r in measured(results)] + [limit]
        log = max(values) / max(min(values), 1e-3) > 20
        if log:
            _plain_log(ax)
        _room_above(ax, limit, log=log)
        silent = [n for n, r in trials if r.constraints[i] == NO_SAMPLES]
        title = f"{term_label(name)[0]} ({judged_in([r for _, r in trials])})"
        if silent:
            title += f"\nno samples, not drawn: {_trials(silent)}"
        if start is not None and start.constraints[i] == NO_SAMPLES:
            title += " (nor the start config)" if silent else "\nno samples, not drawn: start"
        ax.set(title=title, xlabel="trial", ylabel="ms")
        _whole_trials(ax, start=start is not None)
    for k in range(len(names), rows * cols):
        axes[k // cols][k % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    labels = ["the SLO" if label.startswith("SLO ") else label for label in labels]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    name_figure(fig, subject, "The terms that decide feasibility, per trial")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _plain_log(ax: Any) -> None:
    """A log y axis ticked in plain milliseconds (1, 2, 5 per decade): matplotlib's own
    read "6×10^2" beside the linear panels' 1000, 2000."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


LABEL_ROOM = 0.12
"""The share of the axis (below the SLO line, in its scale) kept above the line for its
label: where every point lies under the line the autoscale ended just above it, and the
frame struck through "100 ms"."""


def _room_above(ax: Any, limit: float, *, log: bool) -> None:
    lo, hi = ax.get_ylim()
    if log:
        top = limit * max(1.0 + LABEL_ROOM, (limit / max(lo, 1e-9)) ** LABEL_ROOM)
    else:
        top = limit + max(LABEL_ROOM * limit, LABEL_ROOM * (limit - lo))
    if hi < top:
        ax.set_ylim(lo, top)


def pareto(results: Results, out: Path, start: TrialResult | None = None, *,
           subject: PlotSubject, recommended: Recommended | None = None) -> str:
    save(pareto_figure(results, start=start, subject=subject, recommended=recommended),
         out / "pareto.png", dpi=100)
    return "pareto.png"


def _coincident(results: Results, pts: Sequence[tuple[float, float]]
                ) -> list[tuple[tuple[float, float], list[int]]]:
    """Each point drawn with the configs there (``START`` for the start config), in
    drawing order: each is named, a trial by its number as the tables give it (rep3's
    eight trials were told apart by none, only "start" was named)."""
    groups: dict[tuple[float, float], list[int]] = {}
    for (n, _), (x, y) in zip(results, pts, strict=True):
        groups.setdefault((round(x, 9), round(y, 9)), []).append(n)
    return list(groups.items())


def _names(configs: Sequence[int]) -> str:
    """``start, trials 0, 1, 2, 3``: the configs drawn on one point; ``3`` alone."""
    trials = [n for n in configs if n != START]
    if len(trials) == 1 and START not in configs:
        return str(trials[0])
    parts = (["start"] if START in configs else []) + ([_trials(trials)] if trials else [])
    return ", ".join(parts)


def _name_points(ax: Any, results: Results, pts: Sequence[tuple[float, float]]) -> None:
    """Each point's name beside it, once the axes are scaled: a name whose point lies
    within a name's height and width of one named already goes below its point, not over
    that name (rep3's trials 0 and 1, a hair apart, read "01")."""
    right = max((y for _, y in pts), default=0.0)
    placed: list[tuple[float, float]] = []
    for (value, share), configs in _coincident(results, pts):
        # Left of a point at the axis's right end: a list of names ran off the plot.
        end = share >= right and len(configs) > 1
        x, y = ax.transData.transform((share, value))
        near = any(abs(x - px) < 14 and abs(y - py) < 12 for px, py in placed)
        placed.append((x, y))
        ax.annotate(_names(configs), (share, value),
                    xytext=(-4 if end else 4, -12 if near else 6),
                    textcoords="offset points", fontsize=8, ha="right" if end else "left")


def _in_view(ax: Any, lines: list[float], *, log: bool, pad: float = 0.05) -> None:
    """Widen the x axis so each vertical line sits ``pad`` of its width inside it: the
    autoscale keeps the lines' x but no margin past them, and a reviewer's headroom line
    at 90 % lay on the left edge, listed in the legend but not to be seen."""
    import math

    f, inv = (math.log, math.exp) if log else ((lambda v: v), (lambda v: v))
    lo, hi = (f(v) for v in ax.get_xlim())
    first, last = f(min(lines)), f(max(lines))
    span = max(hi, last) - min(lo, first)
    lo, hi = min(lo, first - pad * span), max(hi, last + pad * span)
    ax.set_xlim(inv(lo), inv(hi))


def pareto_figure(results: Results, *, start: TrialResult | None = None,
                  subject: PlotSubject, recommended: Recommended | None = None) -> Any:
    """Each config's objective against its worst term; the start config (when given)
    among the trials, named "start"; configs on one point named together; the
    recommendation on its own replica count, where given, a star."""
    plt = _pyplot()
    trials = results
    results = _with_start(results, start)
    pts = [(r.value, max(r.constraints, default=-1.0) + 1.0) for _, r in results]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = ["tab:green" if r.feasible else "tab:red" for _, r in results]
    ax.scatter([y for _, y in pts], [x for x, _ in pts], c=colors, alpha=0.7,
               label="trials" + (" and the start config" if start is not None else "")
               + " (green: holds the SLO)")
    values = [x for x, _ in pts]
    if recommended is not None:
        worst = max(recommended.result.constraints, default=-1.0) + 1.0
        _draw_recommended(ax, worst, recommended.result.value, recommended)
        values.append(recommended.result.value)
    front = sorted(pareto_front([(x, y) for x, y in pts]), key=lambda i: pts[i][1])
    ax.plot([pts[i][1] for i in front], [pts[i][0] for i in front], "o-", c="tab:orange",
            mfc="none", label="Pareto front")
    margin = results[0][1].margin if results else 0.0
    ax.axvline(1.0, c="black", lw=1, label="at the SLO limit")
    if margin:
        ax.axvline(1.0 - margin, c="black", lw=1, ls="--", label=f"{margin:.0%} headroom")
    from matplotlib.ticker import NullFormatter, PercentFormatter

    xs = [y for _, y in pts] + [1.0] + ([] if recommended is None else [
        max(recommended.result.constraints, default=-1.0) + 1.0])
    log = max(xs) / max(min(xs), 1e-3) > 10
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    _in_view(ax, [1.0] + ([1.0 - margin] if margin else []), log=log)
    ax.set(xlabel="worst SLO term, as a share of its limit" + (" (log)" if log else ""),
           ylabel=objective_label(trials), title="Goodput against the worst SLO term")
    _share_axis(ax, values, share=any(r.objective is not None for _, r in trials))
    _name_points(ax, results, pts)
    ax.legend(fontsize=8)
    name_figure(fig, subject)
    fig.tight_layout()
    return fig


def importance_plot(values: Mapping[str, float], target: str, out: Path, *,
                    subject: PlotSubject) -> str:
    save(importance_figure(values, target, subject=subject), out / "importance.png", dpi=100)
    return "importance.png"


def importance_figure(values: Mapping[str, float], target: str, *,
                      subject: PlotSubject) -> Any:
    plt = _pyplot()
    names = list(values)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.6))
    ax.barh(names, [values[n] for n in names], color="tab:purple")
    ax.set(xlabel=f"share of the variation in {target}", title="Knob importance (fANOVA)")
    name_figure(fig, subject)
    fig.tight_layout()
    return fig
