"""Study reports: trial history, throughput/TBT Pareto front, knob importance, report.md.

Plots use matplotlib's Agg backend (no display needed). Knob importance needs a few
completed trials with varied parameters; with fewer it is left out and the report says so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.tuner import Tuner, rank

MIN_TRIALS_FOR_IMPORTANCE = 5


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated in (maximize x, minimize y), sorted by x."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y)
                        for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _plots(results: list[tuple[int, TrialResult]], out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    numbers = [n for n, _ in results]
    goodput = [r.goodput_tok_s for _, r in results]
    feasible = [r.feasible for _, r in results]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([n for n, f in zip(numbers, feasible, strict=True) if f],
               [g for g, f in zip(goodput, feasible, strict=True) if f],
               c="tab:green", label="feasible")
    ax.scatter([n for n, f in zip(numbers, feasible, strict=True) if not f],
               [g for g, f in zip(goodput, feasible, strict=True) if not f],
               c="tab:red", marker="x", label="infeasible")
    best, running = [], -math.inf
    for g, f in zip(goodput, feasible, strict=True):
        if f:
            running = max(running, g)
        best.append(running if math.isfinite(running) else math.nan)
    ax.step(numbers, best, where="post", c="black", label="best feasible so far")
    ax.set(xlabel="trial", ylabel="goodput (tok/s)", title="Trial history")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "history.png", dpi=100)
    plt.close(fig)
    written.append("history.png")

    overall = [None if r.summary is None else r.summary.overall for _, r in results]
    pts = [(0.0, math.nan) if o is None else
           (o.throughput_tok_s, math.nan if o.tbt_p99_ms is None else o.tbt_p99_ms)
           for o in overall]
    ok = [i for i, (_, y) in enumerate(pts) if math.isfinite(y)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([pts[i][0] for i in ok], [pts[i][1] for i in ok], c="tab:blue", alpha=0.5,
               label="trials")
    front = [ok[i] for i in pareto_front([pts[i] for i in ok])]
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "o-", c="tab:orange",
            label="Pareto front")
    ax.set(xlabel="throughput (tok/s)", ylabel="TBT P99 (ms)",
           title="Throughput against TBT P99")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=100)
    plt.close(fig)
    written.append("pareto.png")
    return written


def importance(study: optuna.Study) -> dict[str, float] | None:
    """Knob importance (Optuna's default evaluator), or None with too few varied trials."""
    complete = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
        return None
    try:
        with warnings.catch_warnings():
            # Optuna warns (and returns equal shares) when the trials barely differ.
            warnings.simplefilter("ignore", UserWarning)
            result = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None  # e.g. every trial had the same value: nothing to attribute
    return {k: float(v) for k, v in result.items()}


def _importance_plot(values: Mapping[str, float], out: Path) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(values)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.5))
    ax.barh(names, [values[n] for n in names], color="tab:purple")
    ax.set(xlabel="importance", title="Knob importance")
    fig.tight_layout()
    fig.savefig(out / "importance.png", dpi=100)
    plt.close(fig)
    return "importance.png"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_report(tuner: Tuner, slo: SLOSpec, out_dir: Path, *, top: int = 10,
                 start: TrialResult | None = None, title: str = "Tuning report") -> Path:
    """Write the PNGs and ``report.md`` into ``out_dir``; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = tuner.results()
    lines = [f"# {title}", "", f"Study `{tuner.study.study_name}`: {len(results)} completed "
             f"trials of {len(tuner.study.trials)}.", ""]
    if not results:
        lines.append("No completed trials: nothing to plot.")
        path = out_dir / "report.md"
        path.write_text("\n".join(lines) + "\n")
        return path
    images = _plots(results, out_dir)
    imp = importance(tuner.study)
    if imp:
        images.append(_importance_plot(imp, out_dir))
    ranked = sorted(results, key=lambda nr: rank(nr[1]), reverse=True)
    best = ranked[0][1]
    lines += ["## SLO", "", "| class | TTFT P99 (ms) | TBT P99 (ms) |", "|---|---|---|"]
    for p, c in slo.classes().items():
        lines.append(f"| {p.label} | {_fmt(c.ttft_p99_ms or '-')} | {_fmt(c.tbt_p99_ms or '-')} |")
    lines += ["", f"Max preemptions per minute: {_fmt(slo.max_preemptions_per_min or '-')}", ""]
    lines += ["## Best configuration", "",
              f"Goodput {best.goodput_tok_s:.1f} tok/s, "
              f"{'feasible' if best.feasible else 'infeasible (least violation)'}.", "",
              "| knob | best |" + (" start |" if start else ""),
              "|---|---|" + ("---|" if start else "")]
    for k, v in best.config.items():
        row = f"| {k} | {_fmt(v)} |"
        if start:
            row += f" {_fmt(start.config.get(k, '-'))} |"
        lines.append(row)
    if start:
        lines += ["", f"Start config: goodput {start.goodput_tok_s:.1f} tok/s, "
                  f"{'feasible' if start.feasible else 'infeasible'}."]
    lines += ["", f"## Top {min(top, len(ranked))} trials", "",
              "| trial | goodput (tok/s) | feasible | max constraint | token_budget | "
              "chunk_size | max_num_seqs |", "|---|---|---|---|---|---|---|"]
    for n, r in ranked[:top]:
        worst = max(r.constraints) if r.constraints else 0.0
        lines.append(f"| {n} | {r.goodput_tok_s:.1f} | {'yes' if r.feasible else 'no'} | "
                     f"{worst:+.2f} | {r.config.get('token_budget', '-')} | "
                     f"{r.config.get('chunk_size', '-')} | {r.config.get('max_num_seqs', '-')} |")
    lines += ["", "## Plots", ""]
    lines += [f"![{img.removesuffix('.png')}]({img})" for img in images]
    if imp is None:
        lines += ["", f"Knob importance needs at least {MIN_TRIALS_FOR_IMPORTANCE} completed "
                  "trials with varied knobs; left out."]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
