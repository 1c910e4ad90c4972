"""How a live correction learned at one load predicts the engine's step time at another.

The operator's controller corrects its twin on the last windows of the load it serves now,
then asks the corrected twin about other loads: the capacity of fewer replicas (a busier
load on each), or a warm start after a load step. This replays that on the real engine's
iterations that ``twin_fidelity.py --json`` keeps (every iteration's measured step time
and shape, per load): for each pair of loads it corrects the profile on the first load's
iterations, as the controller does on its windows, and judges the result on the second's.

    .venv/bin/python benchmarks/twin_fidelity.py --profile P.yaml --json RUN.json
    .venv/bin/python benchmarks/correction_transfer.py --profile P.yaml RUN.json [RUN2.json]

Per (learned on, judged on) pair and correction (``none``: the profile as calibrated,
``rescale``: one factor, ``refit``: the controller's default, a factor per feature pulled
towards the profile, then one on the sum) it prints the per-iteration mean relative
error and the relative error of the load's summed step time. The sum is what a queue
amplifies (docs/twin.md, Limits): a correction that is right where it learned and a few
percent high at a busier load moves the busier load's TTFT by much more. A sweep of the
refit's pull towards the profile (``--priors``) shows what a stronger one trades.

A load paired with itself is held out: learned on the iterations before its midpoint,
judged on those after, which is what the controller's own check does with a window's two
halves. Its error is the floor a correction meets at the load it learned on; an error
at another load is the carry only where it lies above that floor. ``beyond`` says how far
the judged iterations lie outside what the correction saw: the largest ratio of a
feature's mean per iteration (per kind) to the largest mean any learned window showed,
over the features that carry at least 5 % of a kind's predicted time in kinds carrying
at least 5 % of the load's. A coverage guard would read that figure; the rank
correlation between it and the refit's sum error (over every pair, and over pairs of
different loads) says whether it would guard anything.

A load's iterations are summed per kind and window of ``--window-s`` seconds on the
run's clock (``correction.windows_of``, the equations the engine's counters give a
controller; twin_fidelity's own correction uses 30 s). A JSON written before the
iterations' end times were kept is cut instead, in the order the iterations ran, into
``--windows`` parts of equal count.
The last line is ``RESULT key=value ...``; figures are worst cases over every pair of
different loads in every run given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slopilot.engine.sim.correction import (
    PRIOR_WEIGHT,
    WindowSample,
    corrected,
    windows_of,
)
from slopilot.engine.sim.profile_file import CostProfile, load_profile
from slopilot.engine.sim.shape import FEATURES, KINDS, IterationShape

CORRECTIONS = ("none", "rescale", "refit")
DEFAULT_PRIORS = (0.01, PRIOR_WEIGHT, 1.0, 3.0, 10.0)


@dataclass(frozen=True)
class Load:
    """One load of a fidelity run: its real iterations, in the order they ran."""

    name: str
    rate: float
    measured: np.ndarray  # step seconds per iteration
    kinds: tuple[str, ...]
    shapes: np.ndarray  # one row of FEATURES per iteration
    ends: np.ndarray | None = None  # each iteration's end on the run's clock, if kept

    def part(self, start: float, stop: float) -> Load:
        """The iterations from ``start`` to ``stop`` (fractions of the load, in run order)."""
        n = len(self.measured)
        keep = slice(round(start * n), round(stop * n))
        return Load(self.name, self.rate, self.measured[keep], self.kinds[keep],
                    self.shapes[keep], None if self.ends is None else self.ends[keep])

    def windows(self, parts: int, window_s: float) -> list[WindowSample]:
        """The iterations summed per kind and window of ``window_s`` (without end times:
        in ``parts`` runs of equal count, each its own window)."""
        if self.ends is not None:
            ends, width = self.ends, window_s
        else:
            chunks = np.array_split(np.arange(len(self.measured)), parts)
            ends, width = np.concatenate([np.full(len(c), k + 0.5)
                                          for k, c in enumerate(chunks)]), 1.0
        return windows_of([(float(end), float(step), IterationShape(*map(float, row)))
                           for end, step, row in zip(ends, self.measured, self.shapes,
                                                     strict=True)], width)


@dataclass(frozen=True)
class Judged:
    """A profile's step time against one load's iterations."""

    iteration_mape: float
    total_err: float  # (predicted - measured) / measured of the summed step time


def read_run(path: Path) -> list[Load]:
    """The loads of one ``twin_fidelity.py --json`` file, quietest first."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: cannot read a twin_fidelity JSON ({exc})") from None
    loads_doc = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads_doc, list) or not loads_doc:
        raise SystemExit(f"{path}: no 'loads' list; expected the file twin_fidelity.py "
                         "--json writes")
    return sorted((_load(path, i, d) for i, d in enumerate(loads_doc)), key=lambda x: x.rate)


def _load(path: Path, i: int, d: Any) -> Load:
    where = f"{path}: loads[{i}]"
    try:
        points, shapes = d["points"], d["shapes"]
        measured = np.array([float(p[0]) for p in points])
        kinds = tuple(str(p[2]) for p in points)
        rows = np.array(shapes, dtype=float)
        name, rate = str(d["name"]), float(d["rate"])
        ends = np.array(d["ends"], dtype=float) if d.get("ends") else None
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise SystemExit(f"{where}: expected name, rate, points [measured, predicted, "
                         f"kind] and shapes ({type(exc).__name__}: {exc})") from None
    if not len(measured):
        raise SystemExit(f"{where}: no iterations")
    if rows.shape != (len(measured), len(FEATURES)):
        raise SystemExit(f"{where}: shapes are {rows.shape}, expected ({len(measured)}, "
                         f"{len(FEATURES)}): one row of the form's {len(FEATURES)} features "
                         "per point (a JSON from another form version?)")
    if not np.all(np.isfinite(measured)) or np.any(measured <= 0):
        raise SystemExit(f"{where}: every measured step time must be positive and finite")
    if ends is not None and (ends.shape != measured.shape or not np.all(np.isfinite(ends))):
        raise SystemExit(f"{where}: ends holds {ends.shape[0]} values, expected one finite "
                         f"end time per point ({len(measured)})")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"{where}: unknown iteration kind(s) {', '.join(unknown)}; "
                         f"expected {', '.join(KINDS)}")
    return Load(name, rate, measured, kinds, rows, ends)


def judge(profile: CostProfile, load: Load) -> Judged:
    predicted = load.shapes @ np.array([profile.coefficient(f) for f in FEATURES])
    errors = (predicted - load.measured) / load.measured
    return Judged(float(np.mean(np.abs(errors))),
                  float(predicted.sum() / load.measured.sum() - 1.0))


def correct(profile: CostProfile, how: str, windows: Sequence[WindowSample],
            prior: float = PRIOR_WEIGHT) -> CostProfile:
    if how == "none":
        return profile
    return corrected(profile, windows, refit_first=how == "refit", prior_weight=prior)


SHARE = 0.05
"""A kind, or a feature within a kind, counts towards ``beyond`` from this share of the
predicted time on."""


def beyond(profile: CostProfile, windows: Sequence[WindowSample], load: Load
           ) -> tuple[float, str]:
    """How far ``load``'s iterations lie outside ``windows``: the largest ratio of a
    feature's mean per iteration of a kind to the largest any window of that kind showed
    (inf for a kind no window had), and which ``kind.feature`` it is."""
    coef = np.array([profile.coefficient(f) for f in FEATURES])
    seen: dict[str, np.ndarray] = {}
    for w in windows:
        mean = np.asarray(w.shape.vector()) / w.iterations
        seen[w.kind] = np.maximum(seen.get(w.kind, mean), mean)
    kinds = np.array(load.kinds)
    total = float((load.shapes @ coef).sum())
    worst, where = 0.0, ""
    for kind in sorted(set(load.kinds)):
        rows = load.shapes[kinds == kind]
        if total <= 0 or float((rows @ coef).sum()) < SHARE * total:
            continue
        mean = rows.mean(axis=0)
        per_iteration = float(mean @ coef)
        for i, f in enumerate(FEATURES):
            if coef[i] * mean[i] < SHARE * per_iteration:
                continue
            top = seen[kind][i] if kind in seen else 0.0
            ratio = float(mean[i] / top) if top > 0 else float("inf")
            if ratio > worst:
                worst, where = ratio, f"{kind}.{f}"
    return worst, where


@dataclass(frozen=True)
class Pair:
    """Each correction learned on ``learned``'s windows, judged on ``judged``'s iterations
    (the same load: learned on its first half, judged on its second)."""

    run: str
    learned: Load
    judged: Load
    results: dict[str, Judged]
    beyond: tuple[float, str]

    @property
    def held_out(self) -> bool:
        return self.learned is self.judged


def pairs(profile: CostProfile, runs: dict[str, list[Load]], parts: int,
          window_s: float = 30.0) -> list[Pair]:
    out = []
    for run, loads in runs.items():
        for a in loads:
            for b in loads:
                learned, judged = (a.part(0, 0.5), a.part(0.5, 1)) if a is b else (a, b)
                windows = learned.windows(parts, window_s)
                fixed = {how: correct(profile, how, windows) for how in CORRECTIONS}
                out.append(Pair(run, a, b, {how: judge(p, judged) for how, p in fixed.items()},
                                beyond(profile, windows, judged)))
    return out


def prior_sweep(profile: CostProfile, runs: dict[str, list[Load]], parts: int,
                window_s: float, priors: Sequence[float]
                ) -> list[tuple[float, str, float, float, float]]:
    """Per prior and run: worst |total error| and mean per-iteration error over pairs of
    different loads, and the mean per-iteration error where the correction learned."""
    rows = []
    for prior in priors:
        for run, loads in runs.items():
            across, mapes, home = 0.0, [], []
            for a in loads:
                fixed = correct(profile, "refit", a.windows(parts, window_s), prior)
                for b in loads:
                    j = judge(fixed, b)
                    if a is b:
                        home.append(j.iteration_mape)
                    else:
                        across = max(across, abs(j.total_err))
                        mapes.append(j.iteration_mape)
            rows.append((prior, run, across, float(np.mean(mapes)) if mapes else 0.0,
                         float(np.mean(home))))
    return rows


def _priors(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers, e.g. 0.1,1,3"
                                         ) from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every prior must be >= 0")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, required=True,
                    help="the profile the fidelity run(s) used")
    ap.add_argument("runs", type=Path, nargs="+", help="twin_fidelity.py --json files")
    ap.add_argument("--window-s", type=float, default=30.0,
                    help="seconds of one correction window (default 30, twin_fidelity's)")
    ap.add_argument("--windows", type=int, default=3,
                    help="parts a load's iterations are cut into where the JSON has no "
                    "end times (default 3)")
    ap.add_argument("--priors", type=_priors, default=DEFAULT_PRIORS,
                    help="refit pulls to sweep, comma-separated")
    args = ap.parse_args(argv)
    if args.windows < 1:
        ap.error(f"--windows {args.windows}: expected at least 1")
    if not 0 < args.window_s < float("inf"):
        ap.error(f"--window-s {args.window_s}: expected seconds above 0")
    try:
        profile = load_profile(args.profile)
    except (OSError, ValueError) as exc:
        ap.error(f"--profile {args.profile}: {exc}")
    runs = {str(p): read_run(p) for p in args.runs}
    if len(set(runs)) != len(args.runs):
        ap.error("a run is given twice")
    table = pairs(profile, runs, args.windows, args.window_s)
    sweep = prior_sweep(profile, runs, args.windows, args.window_s, args.priors)
    _print(table, sweep)
    across = [p for p in table if not p.held_out]
    worst = {how: max((abs(p.results[how].total_err) for p in across), default=0.0)
             for how in CORRECTIONS}
    held_out = max((abs(p.results["refit"].total_err) for p in table if p.held_out),
                   default=0.0)
    mape = {how: float(np.mean([p.results[how].iteration_mape for p in across]))
            if across else 0.0 for how in CORRECTIONS}
    quiet_to_busy = [p for p in across
                     if p.learned is runs[p.run][0] and p.judged is runs[p.run][-1]]
    fields = {"runs": len(runs), "pairs": len(across),
              **{f"{how}_worst_total_err": worst[how] for how in CORRECTIONS},
              **{f"{how}_iteration_mape": mape[how] for how in CORRECTIONS},
              "refit_quiet_to_busy_total_err": max(
                  (p.results["refit"].total_err for p in quiet_to_busy), default=0.0,
                  key=abs),
              "refit_held_out_worst_total_err": held_out,
              "beyond_refit_err_spearman": _rank_correlation(table),
              "beyond_refit_err_spearman_other_loads": _rank_correlation(across)}
    print("RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in fields.items()))
    return 0


def _rank_correlation(table: Sequence[Pair]) -> float:
    """Spearman's rank correlation of ``beyond`` with the refit's |sum error| over
    ``table``'s pairs (NaN with fewer than three pairs or no spread)."""
    from scipy.stats import spearmanr

    if len(table) < 3:
        return float("nan")
    x = [p.beyond[0] for p in table]
    y = [abs(p.results["refit"].total_err) for p in table]
    if len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def _print(table: Sequence[Pair], sweep: Sequence[tuple[float, str, float, float, float]]
           ) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    t = Table(title="A correction learned at one load, judged at another: per-iteration "
                    "error / error of the summed step time")
    for col in ("run", "learned on", "judged on", "beyond", *CORRECTIONS):
        t.add_column(col, justify="right")
    for p in table:
        learned, judged = (f"{p.learned.name} (1st half)", f"{p.judged.name} (2nd half)") \
            if p.held_out else (p.learned.name, p.judged.name)
        t.add_row(Path(p.run).name, learned, judged, f"x{p.beyond[0]:.2f} {p.beyond[1]}",
                  *(f"{p.results[h].iteration_mape:.1%} / {p.results[h].total_err:+.1%}"
                    for h in CORRECTIONS),
                  style="dim" if p.held_out else None)
    console.print(t)
    s = Table(title="The refit's pull towards the profile (the controller's is "
                    f"{PRIOR_WEIGHT:g}): worst |sum error| and mean per-iteration error at "
                    "other loads, per-iteration error where it learned")
    for col in ("prior", "run", "worst sum err, other loads", "iter err, other loads",
                "iter err, where learned"):
        s.add_column(col, justify="right")
    for prior, run, across, mape, home in sweep:
        s.add_row(f"{prior:g}", Path(run).name, f"{across:.1%}", f"{mape:.1%}", f"{home:.1%}")
    console.print(s)


if __name__ == "__main__":
    sys.exit(main())
