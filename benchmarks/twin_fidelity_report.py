"""Tables and the plot of ``twin_fidelity.py``: measured against predicted."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from slopilot.engine.calibrate.compare import (
    PERCENTILES,
    ClassFigures,
    IterationFit,
    LoadReport,
)
from slopilot.engine.sim.profile_file import CostProfile
from slopilot.tuner.study.plot_subject import PlotSubject, name_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_KIND_COLOURS = {"decode": "tab:blue", "prefill": "tab:orange", "mixed": "tab:green",
                 "swap": "tab:red"}
_CLASS_MARKERS = {"p0": "o", "p1": "s", "p2": "^"}


def print_report(reports: list[LoadReport], profile: CostProfile, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    runs = Table(title=f"Twin fidelity: {profile.name}, {profile.device.name}, "
                       f"{profile.device.threads or '-'} thread(s), kernels "
                       f"{profile.device.kernels or 'not recorded'}; profile {path}")
    for col in ("load", "req/s", "requests", "busy m/p", "tok/s m/p", "preempt m/p",
                "iter err", "executor err", "iter median", "noise floor", "CPU share",
                "load avg"):
        runs.add_column(col, justify="right")
    for r in reports:
        it = r.iterations
        runs.add_row(r.name + (" (cut short)" if r.truncated else ""), f"{r.rate:.2f}",
                     str(r.requests),
                     f"{r.busy[0]:.0%}/{r.busy[1]:.0%}",
                     f"{r.throughput[0]:.1f}/{r.throughput[1]:.1f}",
                     f"{r.preemptions[0]}/{r.preemptions[1]}", f"{it.mape:.1%}",
                     f"{it.executor_mape:.1%}", f"{it.median_err:.1%}",
                     "-" if it.noise_floor is None else
                     f"{it.noise_floor:.1%} ({it.noise_count})",
                     f"{r.cpu_share:.0%}", str(r.load_average))
    console.print(runs)
    fit = profile.fit
    if fit is not None:
        console.print(f"calibration: {fit.shapes} shapes, mean error {fit.mape:.1%}, CPU share "
                      f"{fit.cpu_share if fit.cpu_share is None else f'{fit.cpu_share:.0%}'}, "
                      f"load average {fit.load_average} (this run: CPU share and load "
                      "average per load above; far apart means different conditions)")
    lat = Table(title="Latency per class: measured / predicted ms (error); * the "
                      "prediction lies inside the measurement's 90 % bootstrap interval",
                caption=f"{within_caption(reports)}")
    for col in ("load", "class", "n", *(f"{m.upper()} p{q}" for m, q in PERCENTILES)):
        lat.add_column(col, justify="right")
    for r in reports:
        for name, c in r.classes.items():
            lat.add_row(r.name, name, str(c.requests), *latency_cells(c))
    console.print(lat)
    kinds = Table(title="Per-iteration step-time error by kind (mean |pred - meas| / meas)")
    for col in ("load", *_KIND_COLOURS, "worst iterations (measured / predicted ms)"):
        kinds.add_column(col, justify="right" if col in _KIND_COLOURS else "left")
    for r in reports:
        by = r.iterations.by_kind
        worst = "; ".join(f"{d}: {m * 1e3:.1f}/{p * 1e3:.1f}"
                          for d, m, p in r.iterations.worst[:2])
        kinds.add_row(r.name, *(f"{by[k][1]:.1%} ({by[k][0]})" if k in by else "-"
                                for k in _KIND_COLOURS), worst)
    console.print(kinds)


def print_corrected(reports: list[LoadReport]) -> None:
    """The live-corrected twin's errors per load and class (the same real run)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="The twin corrected live on the window before each load: "
                        "measured / predicted ms (error)")
    for col in ("load", "class", *(f"{m.upper()} p{q}" for m, q in PERCENTILES)):
        table.add_column(col, justify="right")
    for r in reports:
        for name, c in r.classes.items():
            table.add_row(r.name, name, *latency_cells(c))
        table.add_row(r.name, "iterations", f"error {r.iterations.mape:.1%}", "", "", "")
    table.caption = within_caption(reports)
    Console(width=140).print(table)


def print_repeat(again: list[LoadReport], twin: list[LoadReport]) -> None:
    """The real engine against itself (the same requests served twice), beside the
    calibrated twin's error on the first run: a twin judged on one run cannot be held
    to less than the engine's own difference between two."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="The real engine served the same load again: first / second run "
                        "ms (error); the calibrated twin's error on the first run beside it")
    for col in ("load", "class", *(f"{m.upper()} p{q}" for m, q in PERCENTILES)):
        table.add_column(col, justify="right")
    for r, t in zip(again, twin, strict=True):
        for name, c in r.classes.items():
            errs = t.classes[name].errors() if name in t.classes else {}
            table.add_row(r.name, name, *(
                f"{cell} | twin {errs[f'{m}_p{q}']:.0%}" if f"{m}_p{q}" in errs else cell
                for cell, (m, q) in zip(latency_cells(c), PERCENTILES, strict=True)))
    Console(width=160).print(table)


def print_sensitivity(reports: list[LoadReport], step: float, limit: float) -> None:
    """How far each of the calibrated twin's figures moves with every iteration ``step``
    slower or faster: where it moves over ``limit``, a prediction within ``limit`` would
    need a cost model closer than that, and the figure's error says little of the model."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"The twin's own figures with every iteration {step:.0%} slower or "
                        f"faster: largest move (! over {limit:.0%}), and the calibrated "
                        "twin's error")
    for col in ("load", "class", *(f"{m.upper()} p{q}" for m, q in PERCENTILES)):
        table.add_column(col, justify="right")
    for r in reports:
        for name, c in r.classes.items():
            err = c.errors()
            table.add_row(r.name, name, *(
                "-" if (k := f"{m}_p{q}") not in c.sensitivity else
                f"{c.sensitivity[k]:.0%}{'!' if c.sensitivity[k] > limit else ''}"
                + (f" | err {err[k]:.0%}" if k in err else "") for m, q in PERCENTILES))
    Console(width=160).print(table)
    count, total = sensitive_count(reports, limit)
    print(f"{count} of {total} figures move over {limit:.0%}; the calibrated twin's worst "
          f"error over the other {total - count}: {insensitive_max_err(reports, limit):.1%}")


def sensitive_count(reports: list[LoadReport], limit: float) -> tuple[int, int]:
    """Figures that move over ``limit`` (``print_sensitivity``), of all with a move."""
    moves = [v for r in reports for c in r.classes.values() for v in c.sensitivity.values()]
    return sum(v > limit for v in moves), len(moves)


def insensitive_max_err(reports: list[LoadReport], limit: float) -> float:
    """The worst error over the figures that do not move over ``limit``."""
    return max((e for r in reports for c in r.classes.values()
                for k, e in c.errors().items()
                if k in c.sensitivity and k not in c.sensitive(limit)), default=0.0)


def latency_cells(c: ClassFigures) -> list[str]:
    err, inside = c.errors(), c.within_interval()
    return ["-" if (k := f"{m}_p{q}") not in c.measured else
            f"{c.measured[k] * 1e3:.0f}/{c.predicted[k] * 1e3:.0f} ({err[k]:.0%})"
            + ("*" if inside.get(k) else "") for m, q in PERCENTILES]


def within_interval(reports: list[LoadReport]) -> tuple[int, int]:
    """Figures whose prediction lies inside the measurement's bootstrap interval, of all."""
    flags = [v for r in reports for c in r.classes.values()
             for v in c.within_interval().values()]
    return sum(flags), len(flags)


def within_caption(reports: list[LoadReport]) -> str:
    k, n = within_interval(reports)
    return (f"{k} of {n} predictions inside the 90 % interval of their measurement "
            "(resampling each class's requests)")


def subject_from_json(doc: dict[str, Any], replot: Path) -> PlotSubject:
    """The subject a run's ``--json`` recorded, or (a file from before it did) one that
    says so rather than guess which workload and run it was."""
    if doc.get("subject"):
        return PlotSubject(**doc["subject"])
    unknown = "not recorded in this run's --json (written before plots named it)"
    return PlotSubject(unknown, unknown, f"redrawn with --replot {replot.name}")


def plot(reports: list[LoadReport], profile: CostProfile, target: Path, *,
         subject: PlotSubject, corrected: list[LoadReport] | None = None,
         again: list[LoadReport] | None = None, order: list[str] | None = None) -> None:
    import matplotlib.pyplot as plt

    fig = figure(reports, profile, subject=subject, corrected=corrected, again=again,
                 order=order)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)


def figure(reports: list[LoadReport], profile: CostProfile, *, subject: PlotSubject,
           corrected: list[LoadReport] | None = None, again: list[LoadReport] | None = None,
           order: list[str] | None = None) -> Any:
    """Per load, each real iteration against its prediction; then the latency figures of
    the calibrated twin, of the live-corrected one and of the real engine's second run
    (``--repeat-real``) against its first, when given. ``order``: the loads' names in
    the order they were served, in the title when it is not the panels' own; ``subject``
    (the workload, the twin's profile, the run) under the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(reports, "The calibrated twin", "predicted (ms)")]
    if corrected is not None:
        panels.append((corrected, "The twin corrected live before each load",
                       "predicted (ms)"))
    if again:
        panels.append((again, "The real engine against itself: the same requests again",
                       "second run (ms)"))
    cols = max(len(reports), len(panels))
    fig, grid = plt.subplots(2, cols, figsize=(5 * cols, 9.2), squeeze=False)
    for ax in grid[1][len(panels):]:
        ax.set_visible(False)
    colours = dict(zip((r.name for r in reports), ("tab:blue", "tab:orange", "tab:red"),
                       strict=False))
    for ax, r in zip(grid[0], reports, strict=False):
        for kind, colour in _KIND_COLOURS.items():
            pts = [(m * 1e3, p * 1e3) for m, p, k in r.points if k == kind]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=6, alpha=0.5, color=colour, label=f"{kind} ({len(pts)})")
        _diagonal(ax, [m * 1e3 for m, _, _ in r.points] + [p * 1e3 for _, p, _ in r.points])
        ax.set_title(f"{r.name}, {r.rate:.2f} req/s\nthe calibrated twin's iteration error "
                     f"{r.iterations.mape:.1%}")
        ax.set_xlabel("measured step time (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=7, loc="upper left")
    for ax, (panel, title, ylabel) in zip(grid[1], panels, strict=False):
        _latency_panel(ax, panel, title, colours, ylabel)
    served = "" if order is None or order == [r.name for r in reports] else \
        f"; served in the order {', '.join(order)}"
    name_figure(fig, subject, f"Twin fidelity: {profile.name} on {profile.device.name}{served}")
    fig.tight_layout()
    return fig


def _latency_panel(ax: Axes, reports: list[LoadReport], twin: str,
                   colours: dict[str, str], ylabel: str) -> None:
    values = []
    for r in reports:
        colour = colours.get(r.name, "tab:grey")
        for cls, c in r.classes.items():
            for k, m in c.measured.items():
                p = c.predicted[k]
                values += [m * 1e3, p * 1e3]
                filled = k.startswith("ttft")
                ax.scatter(m * 1e3, p * 1e3, marker=_CLASS_MARKERS[cls],
                           s=46 if k.endswith("99") else 16, alpha=0.85,
                           color=colour if filled else "none", edgecolors=colour)
    for r in reports:
        ax.scatter([], [], color=colours.get(r.name, "tab:grey"), label=r.name)
    for cls, marker in _CLASS_MARKERS.items():
        ax.scatter([], [], color="grey", marker=marker, label=cls)
    _diagonal(ax, values)
    inside, total = within_interval(reports)
    ax.set_title(f"{twin}\nTTFT filled, TBT hollow; p50 small, p99 large\n"
                 f"{inside} of {total} inside the measurement's 90 % interval", fontsize=10)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="upper left")


def reports_from_json(doc: dict[str, Any]) -> tuple[list[LoadReport], list[LoadReport],
                                                    list[LoadReport]]:
    """The loads, the live-corrected twin's and the repeats from ``--json``'s file."""
    def load(d: dict[str, Any]) -> LoadReport:
        fields = dict(d)
        fields["classes"] = {k: ClassFigures(**c) for k, c in d["classes"].items()}
        fields["iterations"] = IterationFit(**d["iterations"])
        return LoadReport(**fields)

    return ([load(d) for d in doc["loads"]],
            [load(d) for d in (doc.get("corrected") or {}).get("loads", ())],
            [load(d) for d in doc.get("real_repeat", ())])


def _diagonal(ax: Axes, values: list[float]) -> None:
    """y = x with a +-10 % band, on log axes spanning the data."""
    positive = [v for v in values if v > 0]
    if not positive:
        return
    lo, hi = min(positive) / 1.3, max(positive) * 1.3
    line = [lo, hi]
    ax.plot(line, line, color="black", lw=0.8)
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line],
                    color="grey", alpha=0.15, label="±10 %")
    from matplotlib.ticker import LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_formatter(NullFormatter())
