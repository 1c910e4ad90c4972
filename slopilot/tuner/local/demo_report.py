"""The demo's report: the tuner report of its live trials, plus the run's timeline.

``timeline.png`` has three panels against wall time: each class's TTFT and TBT P99 over
the trailing rate window with the SLO lines (P2, best effort, has none; a class with no
figure in any window is named in the legend, not left out in silence), the stable
replicas' token budget and chunk size (each trial shaded and named), and the replica count; the
shift is a dashed line. The suptitle names the scenario, the twin and the run.
``timeline.json`` keeps the samples and the printed decision lines.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slopilot.engine import strict_json
from slopilot.engine.request import Priority
from slopilot.engine.sim.profile_file import write_text_atomically
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.local.demo_story import DemoResult, ended_on
from slopilot.tuner.study import report_plots as plots
from slopilot.tuner.study.plot_subject import PlotSubject, name_figure
from slopilot.tuner.study.report import report_files, write_report
from slopilot.tuner.study.results import rank
from slopilot.tuner.study.tuner import Tuner


@dataclass(frozen=True)
class TrialMark:
    """The trial running when a sample was taken: its number (consecutive samples of
    one number are one span on the timeline), where it ran and its config."""

    number: int
    canary: bool
    config: dict[str, Any]


@dataclass(frozen=True)
class Sample:
    t_s: float
    p99_ms: dict[str, float]
    """p0_ttft_p99_ms, p0_tbt_p99_ms, p1_..., p2_...: NaN (or absent) where the window had
    no data."""
    token_budget: int
    chunk_size: int
    replicas: int
    trial: TrialMark | None


_EVENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "alert": ("alert fired", {"color": "tab:red", "ls": "-."}),
    "commit": ("commit", {"color": "tab:green", "ls": "-"}),
    "scale": ("scale", {"color": "tab:green", "ls": "-."}),
    "restored": ("SLO restored", {"color": "tab:green", "ls": ":"}),
    "missed": ("SLO missed again", {"color": "tab:red", "ls": ":"}),
}


def events_of(result: DemoResult) -> list[tuple[float, str]]:
    """Each episode's first alert, its commit or scale and its verdicts, for the
    timeline."""
    out: list[tuple[float, str]] = []
    for e in result.episodes:
        if e.alert_at_s is not None:
            out.append((e.alert_at_s, "alert"))
        if e.action in ("commit", "scale") and e.action_at_s is not None:
            out.append((e.action_at_s, e.action))
        out += [(v.at_s, v.kind) for v in e.verdicts]
    return out


_TRIAL_LOOK: dict[bool, dict[str, Any]] = {
    True: {"color": "tab:gray", "alpha": 0.2},
    False: {"color": "tab:brown", "alpha": 0.2},
}


def trial_spans(samples: Sequence[Sample]) -> list[tuple[float, float, TrialMark]]:
    """Each trial as one span: from its first sample to the next sample after its last
    (the next trial's first, or none's), or its last where the run ended in it. Shading
    each sample instead piled up where the demo sampled often and left gaps where a busy
    machine sampled late, and ran one trial into the next."""
    out: list[tuple[float, float, TrialMark]] = []
    start: Sample | None = None
    for i, s in enumerate(samples):
        if s.trial is not None and (start is None or start.trial is None
                                    or start.trial.number != s.trial.number):
            start = s
        if start is None or start.trial is None:
            continue
        after = samples[i + 1] if i + 1 < len(samples) else None
        if after is None or after.trial is None or after.trial.number != start.trial.number:
            out.append((start.t_s, s.t_s if after is None else after.t_s, start.trial))
            start = None
    return out


def _trial_labels(spans: Sequence[tuple[float, float, TrialMark]], *,
                  min_gap: float) -> list[tuple[float, list[int]]]:
    """Where each trial's number is written: at its span's start, joined to the label
    before it where that starts less than ``min_gap`` earlier."""
    out: list[tuple[float, list[int]]] = []
    for a, _, mark in spans:
        if out and a - out[-1][0] < min_gap:
            out[-1][1].append(mark.number)
        else:
            out.append((a, [mark.number]))
    return out


# Samples this many of the loop's usual steps apart (their median) took no sample between
# them: a tick that ran long (a study's ask, a slow apply) on a busy machine.
GAP_STEPS = 5.0


def sample_gaps(t: Sequence[float]) -> list[tuple[float, float]]:
    """The spans between samples that stand ``GAP_STEPS`` usual steps apart or more."""
    steps = [b - a for a, b in itertools.pairwise(t)]
    if not steps:
        return []
    usual = sorted(steps)[len(steps) // 2]
    return [(a, b) for a, b in itertools.pairwise(t)
            if usual > 0 and b - a >= GAP_STEPS * usual]


def _broken(t: Sequence[float], y: Sequence[float],
            gaps: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """``t`` and ``y`` with a NaN inside each gap, so a line is not drawn across it as if
    measured there."""
    starts = {a: b for a, b in gaps}
    xs: list[float] = []
    ys: list[float] = []
    for x, v in zip(t, y, strict=True):
        xs.append(x)
        ys.append(v)
        if x in starts:
            xs.append((x + starts[x]) / 2)
            ys.append(math.nan)
    return xs, ys


def timeline_figure(samples: list[Sample], slo: SLOSpec, shift_at_s: float, *,
                    subject: PlotSubject, busy: Sequence[tuple[float, float]] = (),
                    events: Sequence[tuple[float, str]] = ()) -> Any:
    """The demo's timeline: each class's P99s against its SLO, the stable knobs with each
    trial shaded and named (``trial_spans``), and the replicas; the load's shift marked
    across all three, the spans the machine was busy (``machine_load.py``) and those no
    sample was taken in (``sample_gaps``) shaded on the P99s, and there each of
    ``events`` (``alert``, ``commit``, ``scale``, ``restored``, ``missed``:
    ``events_of``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t = [s.t_s for s in samples]
    gaps = sample_gaps(t)
    fig, (ax_lat, ax_knob, ax_rep) = plt.subplots(3, 1, figsize=(10, 9), sharex=True,
                                                  gridspec_kw={"height_ratios": [3, 2, 1]})
    colors = {Priority.P0: "tab:red", Priority.P1: "tab:blue", Priority.P2: "tab:gray"}
    for p, cls in slo.classes().items():
        c = p.label
        series = {key: [s.p99_ms.get(f"{c}_{key}_p99_ms", math.nan) for s in samples]
                  for key in ("ttft", "tbt")}
        if all(math.isnan(v) for values in series.values() for v in values):
            # Said, not left out: a reader cannot tell a class omitted from one not sent.
            ax_lat.plot([], [], " ", label=f"{c.upper()}: no figures in any window")
            continue
        for key, style, bound in (("ttft", "-", cls.ttft_p99_ms), ("tbt", ":", cls.tbt_p99_ms)):
            note = " (best effort, no SLO)" if bound is None else ""
            ax_lat.plot(*_broken(t, series[key], gaps), style, color=colors[p],
                        label=f"{c.upper()} {key.upper()} P99{note}")
            if bound is not None:
                ax_lat.axhline(bound, ls=style, color=colors[p], alpha=0.35, lw=1)
    for i, (a, b) in enumerate(busy):
        # The P99s of these spans may be the machine's load: said where they are drawn.
        ax_lat.axvspan(a, b, color="tab:orange", alpha=0.15, lw=0,
                       label="machine busy (other processes' CPU)" if i == 0 else None)
    for i, (a, b) in enumerate(gaps):
        ax_lat.axvspan(a, b, color="k", alpha=0.07, lw=0, hatch="//",
                       label="no sample taken (a tick ran long)" if i == 0
                       else None)
    named: set[str] = set()
    for x, kind in events:
        label, look = _EVENTS[kind]
        ax_lat.axvline(x, lw=1.2, label=None if label in named else label, **look)
        named.add(label)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("ms (faint: SLO)")
    # The chunk dashed over the budget's solid line: the demo starts them equal, where one
    # line hid the other.
    ax_knob.step(t, [s.token_budget for s in samples], where="post", label="token_budget",
                 color="tab:purple", lw=2.5)
    ax_knob.step(t, [s.chunk_size for s in samples], where="post", label="chunk_size",
                 color="tab:olive", ls="--", lw=1.5)
    spans = trial_spans(samples)
    for a, b, mark in spans:
        ax_knob.axvspan(a, b, lw=0, **_TRIAL_LOOK[mark.canary])
        # Where one trial follows another at once, a line tells them apart.
        ax_knob.axvline(a, lw=0.6, color=_TRIAL_LOOK[mark.canary]["color"])
    # Names too close to be read apart (a trial cut within a second) share one label.
    span_x = (t[-1] - t[0]) or 1.0
    for x, numbers in _trial_labels(spans, min_gap=0.06 * span_x):
        ax_knob.text(x, 0.03, ("trial " if len(numbers) == 1 else "trials ")
                     + ", ".join(map(str, numbers)), ha="left", va="bottom", fontsize=7,
                     transform=ax_knob.get_xaxis_transform())
    ax_knob.set_ylabel("stable knobs")
    handles, labels = ax_knob.get_legend_handles_labels()
    for canary in sorted({mark.canary for *_, mark in spans}, reverse=True):
        handles.append(Patch(**_TRIAL_LOOK[canary]))
        labels.append("canary trial" if canary else "trial on all replicas")
    ax_knob.legend(handles, labels, loc="upper left", fontsize=8)
    ax_rep.step(t, [s.replicas for s in samples], where="post", color="k")
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("seconds since start")
    for ax in (ax_lat, ax_knob, ax_rep):
        ax.axvline(shift_at_s, ls="--", color="gray", label="load shift" if ax is ax_lat
                   else None)
    # Above the panel, not on it: a P99 spike after the shift ran under an inside legend.
    ax_lat.legend(loc="lower left", bbox_to_anchor=(0, 1.01), fontsize=8, ncol=4,
                  borderaxespad=0)
    name_figure(fig, subject, "slopilot demo: the live loop's timeline")
    fig.tight_layout()
    return fig


TIMELINE = ("timeline.png", "timeline.json")


def demo_report_files(out_dir: Path) -> list[Path]:
    """What ``write_demo_report`` writes (or, a timeline it does not draw, removes) in
    ``out_dir``."""
    return [*report_files(out_dir), *(out_dir / name for name in TIMELINE)]


def write_demo_report(path: Path, tuner: Tuner, slo: SLOSpec, samples: list[Sample],
                      lines: list[str], *, shift_at_s: float, subject: PlotSubject,
                      twin: Mapping[str, Any] | None = None, result: DemoResult | None = None,
                      rule: str = "", busy: Sequence[tuple[float, float]] = ()) -> Path:
    """``result``: the episodes and the machine, told first; ``rule``: how a restore is
    judged, in words; ``busy``: the spans the machine was busy in."""
    out = path.parent
    # Every file is written beside itself and renamed over it, report.md last: a crash or
    # a full disk part-way leaves each file whole, and the report that is there links no
    # plot still to come.
    plot = out / TIMELINE[0]
    if samples:
        events = [] if result is None else events_of(result)
        plots.save(timeline_figure(samples, slo, shift_at_s, subject=subject, busy=busy,
                                   events=events), plot, dpi=90)
    else:  # an earlier run's plot would read as this run's
        plot.unlink(missing_ok=True)
    # A window with no figure is NaN in a sample: null in the file, which JSON.parse reads.
    write_text_atomically(out / TIMELINE[1], strict_json.dumps(
        {"shift_at_s": shift_at_s, "samples": [asdict(s) for s in samples],
         "decisions": lines, "machine_busy": [list(span) for span in busy],
         "episodes": [] if result is None else [e.describe() for e in result.episodes]},
        default=str, indent=1))
    drawn = "![timeline](timeline.png)" if samples else "No samples: no timeline drawn."
    tail = twin_section(twin) + (f"\n## Timeline\n\n{drawn}\n\n```\n"
                                 + "\n".join(lines) + "\n```\n")
    lead = [] if result is None else happened(result, tuner, rule)
    return write_report(tuner, slo, out, title="slopilot demo: live trials", subject=subject,
                        lead=lead, tail=tail.splitlines())


def happened(result: DemoResult, tuner: Tuner, rule: str) -> list[str]:
    """The report's first sections: each episode, the config the run ended on (which the
    study's best trial, shown next, need not be), how the verdicts were judged, and the
    machine's load."""
    lines = ["## What happened", ""]
    if result.stopped_at_s is not None:
        lines += [f"STOPPED by {result.stopped_by} at t+{result.stopped_at_s:.1f}s: what "
                  "follows is the run up to then.", ""]
    if result.episodes:
        lines += [f"- {e.describe()}" for e in result.episodes] + [""]
        lines.append(ended_on(result)[:1].upper() + ended_on(result)[1:] + ".")
        committed = result.committed()
        ranked = sorted(tuner.results(), key=lambda nr: rank(nr[1]), reverse=True)
        ended = None if committed is None else committed[0].committed_trial
        if ranked and ranked[0][1].feasible and ended is not None and ranked[0][0] != ended:
            lines.append(f"The best trial below (trial {ranked[0][0]}) is the study's best "
                         "by goodput among the trials that held, not the config the "
                         f"replicas ended on (trial {ended}'s, above).")
        lines.append("")
    else:
        lines += ["No episode: no trial, commit nor scale during the run.", ""]
    if rule:
        lines += [rule, ""]
    if result.machine:
        lines += ["## The machine", "", *result.machine, ""]
    return lines


def twin_section(twin: Mapping[str, Any] | None) -> str:
    """The last twin check: predicted vs measured p99s per class, and the verdict."""
    if twin is None:
        return ("\n## The twin\n\nNot checked against the replicas: nothing was asked "
                "of the twin during the run.\n")
    rows = ["| class | TTFT p99 predicted | measured | error | TBT p99 predicted | measured "
            "| error |", "|---|---|---|---|---|---|---|"]

    def cell(v: float | None, unit: str = " ms") -> str:
        if v is None:
            return "n/a"
        return f"{v:+.0%}" if unit == "%" else f"{v:.0f}{unit}"

    for name, c in sorted(twin["classes"].items()):
        rows.append(f"| {name} | {cell(c['ttftP99PredictedMs'])} | {cell(c['ttftP99MeasuredMs'])} "
                    f"| {cell(c['ttftP99Error'], '%')} | {cell(c['tbtP99PredictedMs'])} | "
                    f"{cell(c['tbtP99MeasuredMs'])} | {cell(c['tbtP99Error'], '%')} |")
    verdict = "trusted" if twin["trusted"] else "not trusted: live trials, no warm start"
    return (f"\n## The twin\n\nLast check (window of {twin['windowS']:g} s): {verdict} "
            f"({twin['reason']}); step time {cell(twin['stepTimeError'], '%')} as "
            f"calibrated, {cell(twin['correctedStepTimeError'], '%')} after "
            f"{twin['correction']}.\n\n" + "\n".join(rows) + "\n\n"
            "The P99s are one window's, against a simulation that draws its own arrivals at "
            "the measured rate and starts idle: they carry that window's sampling noise, and "
            "judge the twin only where `twin_max_latency_error` is set, which the demo does "
            "not (docs/twin.md, \"The controller checks its twin before trusting it\"). "
            "The step times judge it.\n")
