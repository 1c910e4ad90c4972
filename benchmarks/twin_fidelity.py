"""How close is the twin to the real engine? The same requests through both.

The real engine (engine loop, scheduler, torch executor, metrics observer) serves
requests drawn from the shipped Azure 2023 conversation trace, with lengths scaled to
the calibrated context and arrivals time-scaled to three loads (light, near saturation,
overloaded; P0/P1/P2 mixed); the simulator on the calibrated profile runs exactly the
same requests at the same arrival times. Per load and class it reports TTFT and TBT
p50/p99 measured against predicted, throughput, preemptions, and each real iteration's
step time against the profile's prediction for its shape.

    slopilot calibrate --model smollm2-135m --threads 1 --out smollm2-cpu.yaml
    python benchmarks/twin_fidelity.py --profile smollm2-cpu.yaml
    # quick: --model tiny-random --quick on both
    # another trace: --trace FILE (any format `slopilot simulate --trace` reads)

Percentiles are numpy's ``percentile`` (linear interpolation between order statistics,
Hyndman-Fan type 7) over each class's requests (TTFT: one value per request) or token
gaps (TBT: every gap of the class's requests); with n requests a TTFT p99 interpolates
between the two slowest at 0.99 (n - 1), so the default 150 requests per load (30 P0,
90 P1, 30 P2) keep it off a single request.

A second twin runs beside the calibrated one: the profile corrected live, as the
operator's controller corrects its twin (``engine/sim/correction.py`` ``corrected``: a
refit, then one factor), on what the engine served just before each load (before the
first, 30 requests the loads do not contain, served after a warm-up of 8 more; the
previous load before the others). Both twins see the same real run. What each
correction learned is printed per feature (``correction before LOAD, on N windows:
tokens x1.33, ...``) and kept in ``--json`` under ``corrected.factors``: a correction
learned on a drifted machine or in another regime shows there first.

Ends with ``RESULT ttft_p50_err=... ttft_p99_err=... tbt_p50_err=... tbt_p99_err=...
iteration_mape=... iteration_noise_floor=... max_err=... within_interval=k/n
corrected_iteration_mape=... corrected_max_err=... corrected_within_interval=k/n``: each
error the worst over loads and classes, max_err the worst of the four. Targets:
max_err <= 0.10, iteration_mape <= 0.05. ``iteration_noise_floor`` is what no cost model
can beat on this machine: the mean distance of the real run's iterations from the median
of their alike ones (``compare.repeat_noise``); an iteration_mape near it is as good as
this machine allows. ``within_interval`` counts the latency figures whose prediction lies
inside the 90 % bootstrap interval of their measurement (``compare.bootstrap_intervals``,
resampling each class's requests): how far the measured figure itself could have landed
with other requests of the same kind; a near-saturation p50 of 27 requests moves a lot.

``drift_before`` and ``drift_after`` time part of the calibration grid again before the
first load and after the last (``calibrate/drift.py``): the median signed error of the
profile on its own shapes, how far the machine itself has moved since calibration (below
0: slower now), which no form can see and only a live correction can follow.

Each of the calibrated twin's figures also carries its sensitivity: the twin runs the
same requests twice more with every iteration 2 % slower and 2 % faster (about the
iterations' own error), and the figure's largest move is kept. Near saturation a queue
amplifies: a low class's TTFT p50 can move by several times the 2 %, and no cost model
can be held within 10 % on such a figure. ``sensitive_figures=k/n`` counts the figures
that move over 10 %, and ``max_err_insensitive`` is the calibrated twin's worst error
over the others (``max_err`` stays the worst over all of them).

``--repeat-real near,over`` serves those loads a second time on the real engine after
all three and compares the second run with the first exactly as the twin is compared
(``compare`` with the second run in the twin's place), adding ``real_repeat_max_err``
(the worst such difference), ``twin_max_err_same_loads`` (the calibrated twin's worst on
the same loads) and ``real_repeat_loads`` to the RESULT line: the engine's own
repeatability on this machine, the floor under any twin's error against one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from twin_fidelity_report import (
    insensitive_max_err,
    plot,
    print_corrected,
    print_repeat,
    print_report,
    print_sensitivity,
    reports_from_json,
    sensitive_count,
    subject_from_json,
    within_interval,
)

from slopilot.engine.calibrate.compare import PERCENTILES, LoadReport, compare, sensitivity
from slopilot.engine.calibrate.drift import DriftCheck, drift_check
from slopilot.engine.calibrate.replay import Recorder, replay_real, replay_sim
from slopilot.engine.config import EngineConfig
from slopilot.engine.request import Priority
from slopilot.engine.sim.calibrated import CalibratedCostModel
from slopilot.engine.sim.correction import (
    corrected,
    describe_factors,
    factors,
    rescaled,
    windows_of,
)
from slopilot.engine.sim.profile_file import CostProfile, check_profile_for, load_profile
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.engine.sim.trace import TraceWorkload, read_trace
from slopilot.engine.sim.trace_formats import FORMATS
from slopilot.engine.sim.twin import with_profile
from slopilot.engine.sim.workload import ClassMix, RequestSpec
from slopilot.tuner.study.plot_subject import PlotSubject

LOADS = (("light", 0.3), ("near saturation", 0.85), ("overloaded", 1.3))
CLASSES = ClassMix.of({Priority.P0: 0.2, Priority.P1: 0.6, Priority.P2: 0.2})
# Per load; the real run's time grows with it (~23 min quiet on SmolLM2 at 150).
REQUESTS, QUICK_REQUESTS = 150, 80
WARMUP_REQUESTS, LIVE_WINDOW_REQUESTS = 8, 30
CORRECTION_WINDOW_S = 30.0
"""The live correction's equations: one per kind and window of this many seconds."""
SENSITIVITY, SENSITIVE_LIMIT = 0.02, 0.10
"""A figure is sensitive when the twin's own figure moves by more than SENSITIVE_LIMIT
with every iteration SENSITIVITY slower or faster (about the iterations' own noise)."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, type=Path, help="from slopilot calibrate")
    p.add_argument("--model", default=None, help="the checkpoint the profile was "
                   "calibrated on (default: the profile's model name, e.g. smollm2-135m)")
    p.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    p.add_argument("--requests", type=int, default=None, help="requests per load (default "
                   f"{REQUESTS}, --quick {QUICK_REQUESTS}: 20/60/20 %% P0/P1/P2)")
    p.add_argument("--prompt-mean", type=float, default=None,
                   help="mean prompt tokens after scaling the trace (default: 1/8 of the "
                   "calibrated context)")
    p.add_argument("--output-mean", type=float, default=None,
                   help="mean output tokens after scaling (default: prompt mean / 4)")
    p.add_argument("--token-budget", type=int, default=256)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="default: the calibrated largest decode batch")
    p.add_argument("--loads", default=",".join(f"{f:g}" for _, f in LOADS),
                   help="three fractions of the twin's saturation rate")
    p.add_argument("--trace", default="azure-llm-2023-conv", metavar="FILE",
                   help="the trace whose requests are drawn: a shipped one by name or a "
                   "file in any format `slopilot simulate --trace` reads (docs/traces.md)")
    p.add_argument("--trace-format", choices=FORMATS, default=None,
                   help="the trace's format (default: by its suffix and header)")
    p.add_argument("--trace-offset", type=int, default=0, help="first trace request used")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=1800.0, metavar="SECONDS",
                   help="cut a load's real run after this long (it is then reported as "
                   "truncated: a busy machine serves far below the twin's rate)")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default: docs/"
                   "twin_fidelity[_quick].png)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--replot", type=Path, default=None, metavar="JSON",
                   help="draw the plot again from a run's --json file (with --profile and "
                   "--plot), running nothing")
    p.add_argument("--repeat-real", default="", metavar="LOADS",
                   help="after the loads, serve these again on the real engine (comma-"
                   "separated: light, near, over, or all) and compare the second run with "
                   "the first as the twin is compared: the engine's own repeatability")
    p.add_argument("--order", default="light,near,over", metavar="LOADS",
                   help="the order the loads are served in (all three, comma-separated; "
                   "default light,near,over). A machine that drifts during the run moves "
                   "with time, the cost model's regime errors with the load: serving them "
                   "in another order tells the two apart")
    return p.parse_args()


REPEAT_NAMES = {"light": 0, "near": 1, "over": 2}


def load_order(text: str) -> list[int]:
    """``--order``'s load indices, in the order they are served."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in REPEAT_NAMES]
    if bad:
        raise SystemExit(f"--order {text!r}: unknown load {bad[0]!r}; use light, near, over")
    if sorted(REPEAT_NAMES[n] for n in names) != [0, 1, 2]:
        raise SystemExit(f"--order {text!r}: name each of light, near, over once")
    return [REPEAT_NAMES[n] for n in names]


def repeat_loads(text: str) -> list[int]:
    """``--repeat-real``'s load indices, in load order."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return [0, 1, 2]
    bad = [n for n in names if n not in REPEAT_NAMES]
    if bad:
        raise SystemExit(f"--repeat-real {text!r}: unknown load {bad[0]!r}; use light, "
                         "near, over (comma-separated) or all")
    return sorted({REPEAT_NAMES[n] for n in names})


def run_subject(args: argparse.Namespace, profile: CostProfile, n: int, prompt_mean: float,
                output_mean: float) -> PlotSubject:
    """What the plot names: the trace's slice and how it was scaled, the profile, and the
    run's options and start (file names only: a plot is shared beyond this machine)."""
    import time

    loads = ", ".join(f"{name} {f}" for (name, _), f in zip(LOADS, args.loads.split(","),
                                                             strict=True))
    workload = (f"trace {Path(args.trace).name}, requests {args.trace_offset}-"
                f"{args.trace_offset + n - 1}, prompts scaled to mean {prompt_mean:.0f} "
                f"tokens and outputs to {output_mean:.0f}; loads {loads} x saturation")
    twin = (f"{profile.model.name} on calibrated profile {Path(args.profile).name} "
            f"({profile.device.name})")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run = (f"benchmarks/twin_fidelity.py --seed {args.seed} --token-budget "
           f"{args.token_budget} --chunk-size {args.chunk_size} --order {args.order}"
           + (f" --repeat-real {args.repeat_real}" if args.repeat_real else "")
           + f", started {when}")
    return PlotSubject(workload, twin, run)


def workload(profile: CostProfile, n: int, prompt_mean: float, output_mean: float,
             offset: int, seed: int, trace: str = "azure-llm-2023-conv",
             fmt: str | None = None) -> list[RequestSpec]:
    """n consecutive trace requests, lengths scaled to the means, times as recorded."""
    records = read_trace(trace, fmt=fmt)[offset:offset + n]
    if len(records) < n:
        raise SystemExit(f"--trace-offset {offset}: the trace has too few requests left")
    context = (profile.fit.max_context if profile.fit and profile.fit.max_context
               else profile.model.max_position_embeddings)
    sp = prompt_mean / (sum(r.prompt_tokens for r in records) / n)
    so = output_mean / (sum(r.output_tokens for r in records) / n)
    max_out = max(2, context // 8)
    scaled = [dataclasses.replace(
        r, arrival_time=r.arrival_time - records[0].arrival_time,
        prompt_tokens=max(8, min(context - max_out, round(r.prompt_tokens * sp))),
        output_tokens=max(2, min(max_out, round(r.output_tokens * so)))) for r in records]
    wl = TraceWorkload(scaled, seed=seed, vocab_size=profile.model.vocab_size,
                       classes=CLASSES)
    return list(wl.initial())


def at_rate(specs: list[RequestSpec], rate: float) -> list[RequestSpec]:
    """The trace's own arrival pattern, time-scaled to ``rate`` requests per second,
    the first arrival at 0."""
    first = specs[0].arrival_time
    span = specs[-1].arrival_time - first
    scale = (len(specs) - 1) / span / rate if span > 0 else 1.0
    return [dataclasses.replace(s, arrival_time=(s.arrival_time - first) * scale)
            for s in specs]


def twin_scenario(profile: CostProfile, path: Path) -> Scenario:
    base = parse_scenario({
        "name": "twin-fidelity", "gpu": profile.device.name, "model": profile.model.name,
        # The workload is replaced by the trace's requests; this one only fills the form.
        "duration_s": 60, "workload": {"type": "open_loop", "prompt_tokens": 16,
                                       "output_tokens": 4,
                                       "arrivals": {"process": "poisson", "rate": 1}}},
        source=str(path))
    return with_profile(base, profile)


def saturation_rate(scenario: Scenario, config: EngineConfig,
                    specs: list[RequestSpec]) -> float:
    """Requests per second the twin finishes when everything arrives at once."""
    rec = Recorder()
    burst = [dataclasses.replace(s, arrival_time=0.0) for s in specs]
    replay_sim(scenario, config, burst, rec)
    return len(specs) / max(rec.finished.values())


def run_load(name: str, rate: float, specs: list[RequestSpec], twins: list[Twin],
             config: EngineConfig, executor: Any, time_limit_s: float,
             moved: list[Twin]) -> tuple[list[LoadReport], Recorder, Any]:
    """One load through the real engine, then through each twin; a report per twin,
    the real run's recorder and its run (start and span on the wall clock). The first
    twin's figures carry their sensitivity: how far they move on the ``moved`` twins."""
    real, run = serve_real(name, specs, config, executor, twins[0].cost, time_limit_s)
    reports, sims = [], []
    for twin in twins:
        sim = Recorder()
        replay_sim(twin.scenario, config, specs, sim)
        sims.append(sim)
        sim_span = max(sim.finished.values()) if sim.finished else 0.0
        reports.append(_stamped(compare(
            name, rate, real, sim, twin.cost, first_arrival_real=run.t0,
            real_span_s=run.wall_s, sim_span_s=sim_span), run, run.truncated))
    others = []
    for twin in moved:
        others.append(Recorder())
        replay_sim(twin.scenario, config, specs, others[-1])
    for label, moves in sensitivity(sims[0], others).items():
        if label in reports[0].classes:
            reports[0].classes[label].sensitivity = moves
    return reports, real, run


def serve_real(name: str, specs: list[RequestSpec], config: EngineConfig, executor: Any,
               cost: CalibratedCostModel, time_limit_s: float) -> tuple[Recorder, Any]:
    """``specs`` through the real engine: its recorder and run (start, span, CPU share)."""
    real = Recorder()
    run = replay_real(real_engine(executor, config, cost, real), specs, real,
                      time_limit_s=time_limit_s)
    if run.truncated:
        print(f"{name}: cut after {time_limit_s:g} s with {len(real.finished)} of "
              f"{len(specs)} requests done", file=sys.stderr)
    return real, run


def _stamped(report: LoadReport, run: Any, truncated: bool) -> LoadReport:
    """The report with the conditions its real run had."""
    report.cpu_share, report.truncated = run.cpu_share, truncated
    report.load_average = round(os.getloadavg()[0], 2)
    return report


def machine_drift(executor: Any, cost: CalibratedCostModel, when: str) -> DriftCheck:
    """Part of the calibration grid timed again: how far this machine has moved from
    the profile (every shape the same way) apart from what the form gets wrong."""
    check = drift_check(executor, cost)
    print(f"drift {when}: the profile predicts {check.shapes} calibration shapes "
          f"{check.median_error:+.1%} (median; mean |error| {check.mape:.1%})",
          file=sys.stderr, flush=True)
    return check


def serve_again(first: LoadReport, served: tuple[Recorder, Any], specs: list[RequestSpec],
                config: EngineConfig, executor: Any, cost: CalibratedCostModel,
                time_limit_s: float) -> LoadReport:
    """The load's requests served a second time by the real engine, compared with its
    first run as a twin is: the error a perfect twin would still show against one run."""
    print(f"{first.name} again, on the real engine", file=sys.stderr, flush=True)
    real1, run1 = served
    real2, run2 = serve_real(first.name, specs, config, executor, cost, time_limit_s)
    return _stamped(compare(first.name, first.rate, real1, real2, cost,
                            first_arrival_real=run1.t0, real_span_s=run1.wall_s,
                            sim_span_s=run2.wall_s, first_arrival_sim=run2.t0),
                    run2, run1.truncated or run2.truncated)


@dataclasses.dataclass(frozen=True)
class Twin:
    scenario: Scenario
    cost: CalibratedCostModel


def twin_of(base: Scenario, profile: CostProfile) -> Twin:
    return Twin(with_profile(base, profile), CalibratedCostModel(profile))


def live_corrected(profile: CostProfile, served: Recorder, before: str
                   ) -> tuple[CostProfile, dict[str, float]]:
    """The profile corrected on what the engine served just before, as the operator's
    controller corrects its twin on the last windows (refit, then one factor), and what
    the correction learned per feature (printed: a correction learned in another regime
    or on a drifted machine shows here first)."""
    windows = windows_of([(it.end, it.step_s, it.shape) for it in served.iterations],
                         CORRECTION_WINDOW_S)
    fixed = corrected(profile, windows)
    learned = factors(profile, fixed)
    print(f"correction before {before}, on {len(windows)} windows: "
          f"{describe_factors(learned)}", file=sys.stderr, flush=True)
    return fixed, learned


def main() -> int:
    args = parse_args()
    try:
        return run(args)
    except ValueError as exc:  # a bad profile, model, device or option: said, not traced
        print(f"twin_fidelity: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    check_profile_for(profile, model=args.model)
    if args.replot is not None:
        doc = json.loads(args.replot.read_text())
        reports, live, again = reports_from_json(doc)
        target = args.plot or Path("docs") / "twin_fidelity.png"
        plot(reports, profile, target, corrected=live or None, again=again,
             order=doc.get("order"), subject=subject_from_json(doc, args.replot))
        print(f"plot: {target}")
        return 0
    cost = CalibratedCostModel(profile)
    scenario = twin_scenario(profile, args.profile)
    context = profile.fit.max_context if profile.fit and profile.fit.max_context else 1024
    prompt_mean = args.prompt_mean or context / 8
    output_mean = args.output_mean or max(4.0, prompt_mean / 4)
    n = args.requests or (QUICK_REQUESTS if args.quick else REQUESTS)
    if n < 10:
        raise SystemExit(f"--requests {n}: expected at least 10 (a percentile per class "
                         "needs a few requests of each)")
    seqs = args.max_num_seqs or (profile.fit.max_num_seqs if profile.fit else 32) or 32
    config = EngineConfig(token_budget=args.token_budget, chunk_size=args.chunk_size,
                          max_num_seqs=seqs, block_size=profile.block_size,
                          swap_space_gb=1.0)
    specs = workload(profile, n, prompt_mean, output_mean, args.trace_offset, args.seed,
                     args.trace, args.trace_format)
    subject = run_subject(args, profile, n, prompt_mean, output_mean)
    repeats = repeat_loads(args.repeat_real)
    order = load_order(args.order)
    fractions = [float(f) for f in args.loads.split(",")]
    if len(fractions) != 3 or not all(f > 0 for f in fractions):
        raise SystemExit(f"--loads {args.loads!r}: expected three positive fractions")
    mu = saturation_rate(scenario, config, specs)
    executor = build_executor(args.model or profile.model.name, profile, cost, config,
                              context)
    if executor.decode_knee_tokens != cost.decode_knee_tokens:
        print(f"warning: this machine's decode_spill knee is {executor.decode_knee_tokens} padded "
              f"tokens, the profile's {cost.decode_knee_tokens}: calibrated on another "
              "cache size; recalibrate here", file=sys.stderr)
    # Before the loads, requests they do not contain (the trace's next ones): first a few
    # at the twin's saturation rate, not kept (kernel caches and the allocator warm, as
    # in calibration: a cold start would read as a slow machine), then a live window at
    # the first load's rate, the one the twin is corrected on before that load.
    extra = workload(profile, WARMUP_REQUESTS + LIVE_WINDOW_REQUESTS, prompt_mean,
                     output_mean, args.trace_offset + n, args.seed, args.trace,
                     args.trace_format)
    replay_real_warmup(executor, config, cost, at_rate(extra[:WARMUP_REQUESTS], mu))
    drift_before = machine_drift(executor, cost, "before the loads")
    served = replay_real_warmup(executor, config, cost,
                                at_rate(extra[WARMUP_REQUESTS:], fractions[order[0]] * mu))
    calibrated_twin = Twin(scenario, cost)
    moved = [twin_of(scenario, rescaled(profile, 1 + d, note=f"moved {d:+.0%}"))
             for d in (SENSITIVITY, -SENSITIVITY)]
    # Served in --order; kept in load order (light, near, over) for every table after.
    ran: dict[int, tuple[LoadReport, LoadReport, tuple[Recorder, Any], dict[str, float]]] = {}
    for i in order:
        name, f = LOADS[i][0], fractions[i]
        print(f"{name}: {f * mu:.2f} req/s ({f:g} x the twin's {mu:.2f} req/s saturation)",
              file=sys.stderr, flush=True)
        fixed_profile, learned = live_corrected(profile, served, name)
        fixed = twin_of(scenario, fixed_profile)
        (calibrated_report, corrected_report), served, run_ = run_load(
            name, f * mu, at_rate(specs, f * mu), [calibrated_twin, fixed], config,
            executor, args.time_limit, moved)
        ran[i] = (calibrated_report, corrected_report, (served, run_), learned)
    reports = [ran[i][0] for i in range(len(LOADS))]
    live = [ran[i][1] for i in range(len(LOADS))]
    firsts = [ran[i][2] for i in range(len(LOADS))]
    corrections = [ran[i][3] for i in range(len(LOADS))]
    again = [serve_again(reports[i], firsts[i], at_rate(specs, fractions[i] * mu), config,
                         executor, cost, args.time_limit) for i in repeats]
    drift_after = machine_drift(executor, cost, "after the loads")
    print_report(reports, profile, args.profile)
    print_corrected(live)
    if again:
        print_repeat(again, [reports[i] for i in repeats])
    print_sensitivity(reports, SENSITIVITY, SENSITIVE_LIMIT)
    target = args.plot or Path("docs") / ("twin_fidelity_quick.png" if args.quick
                                          else "twin_fidelity.png")
    plot(reports, profile, target, corrected=live, again=again,
         order=[LOADS[i][0] for i in order], subject=subject)
    worst, iteration_mape, noise = summary(reports)
    live_worst, live_mape, _ = summary(live)
    if args.json:
        args.json.write_text(json.dumps({
            "order": [LOADS[i][0] for i in order],
            "subject": dataclasses.asdict(subject),
            "worst": worst, "iteration_mape": iteration_mape, "iteration_noise_floor": noise,
            "corrected": {"worst": live_worst, "iteration_mape": live_mape,
                          "factors": corrections,
                          "loads": [dataclasses.asdict(r) for r in live]},
            "real_repeat": [dataclasses.asdict(r) for r in again],
            "drift": {"before": dataclasses.asdict(drift_before),
                      "after": dataclasses.asdict(drift_after)},
            "loads": [dataclasses.asdict(r) for r in reports]}, default=str, indent=1))
    print(f"plot: {target}")
    print("RESULT " + " ".join(f"{k}_err={v:.3f}" for k, v in worst.items())
          + f" iteration_mape={iteration_mape:.3f} iteration_noise_floor={noise:.3f}"
          f" drift_before={drift_before.median_error:+.3f}"
          f" drift_after={drift_after.median_error:+.3f}"
          f" max_err={max(worst.values()):.3f}"
          f" within_interval={'/'.join(map(str, within_interval(reports)))}"
          f" corrected_iteration_mape={live_mape:.3f}"
          f" corrected_max_err={max(live_worst.values()):.3f}"
          f" corrected_within_interval={'/'.join(map(str, within_interval(live)))}"
          f" sensitive_figures={'/'.join(map(str, sensitive_count(reports, SENSITIVE_LIMIT)))}"
          f" max_err_insensitive={insensitive_max_err(reports, SENSITIVE_LIMIT):.3f}"
          + (f" real_repeat_max_err={max(r.worst_error() for r in again):.3f}"
             f" twin_max_err_same_loads={max(reports[i].worst_error() for i in repeats):.3f}"
             f" real_repeat_loads={'+'.join(r.name.split()[0] for r in again)}"
             if again else ""))
    return 0


def summary(reports: list[LoadReport]) -> tuple[dict[str, float], float, float]:
    """The worst error per percentile over loads and classes; the iteration error over
    every real iteration; the noise floor over those with alike ones."""
    worst = {f"{m}_p{q}": max((c.errors().get(f"{m}_p{q}", 0.0) for r in reports
                               for c in r.classes.values()), default=0.0)
             for m, q in PERCENTILES}
    iteration_mape = (sum(r.iterations.mape * r.iterations.count for r in reports)
                      / max(1, sum(r.iterations.count for r in reports)))
    alike = sum(r.iterations.noise_count for r in reports)
    noise = (sum((r.iterations.noise_floor or 0.0) * r.iterations.noise_count
                 for r in reports) / alike) if alike else float("nan")
    return worst, iteration_mape, noise


def build_executor(model: str, profile: CostProfile, cost: CalibratedCostModel,
                   config: EngineConfig, context: int) -> Any:
    from slopilot.engine.executors.kernel_modes import executor_modes
    from slopilot.engine.executors.torch_runner import TorchExecutor

    bs = config.block_size
    # The kernels the profile was timed with: the twin and the engine run the same code.
    cpu_kernels, decode_graphs, piecewise_graphs = executor_modes(profile.device.kernels)
    executor = TorchExecutor(model, device=profile.device.type,
                             dtype=profile.dtype, num_gpu_blocks=cost.num_kv_blocks(bs),
                             num_cpu_blocks=cost.num_cpu_blocks(bs, config.swap_space_gb),
                             block_size=bs, max_model_len=context,
                             num_threads=profile.device.threads,
                             cpu_kernels=cpu_kernels, decode_graphs=decode_graphs,
                             piecewise_graphs=piecewise_graphs)
    # As a server does before it serves: no measured iteration pays for a capture.
    executor.capture_decode_graphs(config.max_num_seqs)
    return executor


def real_engine(executor: Any, config: EngineConfig, cost: CalibratedCostModel,
                recorder: Recorder) -> Any:
    """The engine as a server runs it (swap timing, metrics observer), recording."""
    from slopilot.engine.engine import LLMEngine
    from slopilot.engine.metrics import EngineMetrics
    from slopilot.engine.metrics_observer import MetricsObserver

    return LLMEngine(config, executor, executor.num_gpu_blocks, executor.num_cpu_blocks,
                     cost.swap_time_per_block(config.block_size),
                     observers=[MetricsObserver(EngineMetrics(cost.model.name)), recorder])


def replay_real_warmup(executor: Any, config: EngineConfig, cost: CalibratedCostModel,
                       specs: list[RequestSpec]) -> Recorder:
    """Requests before the loads, not reported: kernel caches warm, as in calibration;
    their iterations are the first live window, so they run on the loads' engine."""
    served = Recorder()
    replay_real(real_engine(executor, config, cost, served), specs, served)
    return served


if __name__ == "__main__":
    sys.exit(main())
