"""Verdict transfer: does `slopilot tune`'s verdict on its windows hold on the whole trace?

For each case, a short study (``--trials``, one replica, no capacity search) and then the
replay its check command runs: the whole trace, followed past its end, with the best
config the study found on the same replica. The two agree when both hold the SLO or
both miss it; a study that says "holds" over a whole replay that misses is the failure
this measures (a reasoning trace's requests outlived the 30 s warm-up: docs/tuning.md).

Cases: the shipped conversation trace (short requests: its windows must not move);
an Azure-2024-shaped trace (the 2024 CSV's zone-suffixed dates; a 900 s diurnal ramp to
6 req/s of ~500-token prompts and, at 120 s, an off-peak burst of 40 prompts of
2,500-3,500 tokens within a second, 1.5 % of the requests: neither busiest minute holds
it);
the review's reasoning trace (0.25 req/s for 900 s, outputs of 8,000-16,000 tokens) on
the default deployment with a long-context model (Llama-3.1-8B: Llama-3-8B's 8,192-token
context refuses them); a longer one with shorter outputs (judged on windows, not
whole); and two traces on a slow-decode deployment (Llama-3-70B on 2 x A100, ~50 ms a
step: requests of 1,500-3,000 tokens live ~2.5 minutes), one whose whole replay misses
and one whose whole replay holds.

The study runs as a ``slopilot tune`` process and the replay through the simulator's API
that ``slopilot simulate`` uses, so the script runs unchanged on a tree from before the
windows were sized (PYTHONPATH=that tree) for a before/after table.

    .venv/bin/python benchmarks/window_transfer.py [--trials 2] [--cases a,b,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import slopilot
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.summary_view import simulate_json
from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace, replay_measure

TREE = Path(slopilot.__file__).resolve().parents[1]
"""The slopilot tree this script runs: its studies run the same one."""

SLOW_DECODE = """\
name: slow-decode
description: one tp=2 replica of Llama-3-70B on 2 x A100, a ~50 ms decode step
gpu: A100
num_gpus: 2
tp: 2
model: llama-3-70b
gpu_memory_utilization: 0.95
duration_s: 60
seed: 0
workload:
  type: open_loop
  arrivals: {process: poisson, rate: 1}
  prompt_tokens: {dist: fixed, value: 100}
  output_tokens: {dist: fixed, value: 10}
slo:
  profile: relaxed
"""

# The default deployment for a bare --trace (azure-conv-2023) on Llama-3.1-8B: the same
# cost model, with a context (128k) that holds a reasoning request's 8,000-16,000 tokens
# of output; Llama-3-8B's 8,192 refuses them (the server's 400, and the twin's).
LONG_CONTEXT = """\
name: long-context-8b
description: azure-conv-2023's deployment on Llama-3.1-8B (a 128k context)
gpu: H100
num_gpus: 1
tp: 1
model: llama-3.1-8b
gpu_memory_utilization: 0.9
duration_s: 1401
seed: 0
engine: {}
workload:
  type: trace
  trace: azure-llm-2023-conv
  time_scale: 0.4
  classes: {p1: 1.0}
slo:
  profile: standard
  classes:
    p0: {ttft_p99_ms: 100, tbt_p99_ms: 20}
    p1: {ttft_p99_ms: 500, tbt_p99_ms: 100}
  max_preemptions_per_min: 10
"""

CLI = "import sys; from slopilot.cli import main; sys.argv[0] = 'slopilot'; sys.exit(main())"


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str | None
    """``slow`` for the slow-decode deployment, ``long`` for the default one on a long-context
    model, a scenario name, or None (bare --trace)."""
    rate: float = 0.0
    span_s: float = 0.0
    outputs: tuple[int, int] = (0, 0)
    """A generated reasoning trace's; rate 0: the scenario's own trace."""
    shape: str = "reasoning"
    """``reasoning`` (``reasoning_trace``) or ``burst`` (``burst_trace``)."""


CASES = (
    Case("azure-conv", "azure-conv-2023"),
    Case("azure24-burst", None, 6.0, 900.0, shape="burst"),
    Case("reasoning-900s", "long", 0.25, 900.0, (8000, 16000)),
    Case("reasoning-1800s", "long", 0.5, 1800.0, (4000, 8000)),
    Case("slow-miss", "slow", 0.2, 1200.0, (1500, 3000)),
    Case("slow-hold", "slow", 0.14, 1200.0, (1500, 3000)),
)


def reasoning_trace(path: Path, rate: float, span_s: float, outputs: tuple[int, int]) -> None:
    """Poisson arrivals, prompts of 200-600 tokens (the review's generator, seed 1)."""
    rng = random.Random(1)
    rows, t = ["arrival_time,prompt_tokens,output_tokens"], 0.0
    while (t := t + rng.expovariate(rate)) <= span_s:
        rows.append(f"{t:.3f},{rng.randint(200, 600)},{rng.randint(*outputs)}")
    path.write_text("\n".join(rows) + "\n")


def burst_trace(path: Path, peak: float, span_s: float) -> None:
    """Azure's 2024 CSV (dates with a zone): Poisson arrivals on a diurnal ramp from a
    tenth of ``peak`` req/s to ``peak`` and back, lognormal prompts (median 500) and
    outputs (median 40), and at 120 s 40 prompts of 2,500-3,500 tokens within a second
    (seed 3)."""
    rng = random.Random(3)
    start = datetime.datetime(2024, 5, 10, tzinfo=datetime.UTC)
    rows, t = [], 0.0
    while True:
        t += rng.expovariate(peak * (0.1 + 0.9 * math.sin(math.pi * t / span_s) ** 2))
        if t >= span_s:
            break
        rows.append((t, max(16, min(4000, int(rng.lognormvariate(math.log(500), 0.7)))),
                     max(1, int(rng.lognormvariate(math.log(40), 0.8)))))
    rows += [(120 + rng.uniform(0, 1.0), rng.randint(2500, 3500), rng.randint(1, 20))
             for _ in range(40)]
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{(start + datetime.timedelta(seconds=at)).isoformat(sep=' ')},{p},{o}"
              for at, p, o in sorted(rows)]
    path.write_text("\n".join(lines) + "\n")


def run_case(case: Case, trials: int, work: Path) -> dict[str, Any]:
    flags: list[str] = []
    scenario_arg = case.scenario
    if case.scenario in ("slow", "long"):
        scenario_arg = str(work / f"{case.scenario}.yaml")
        Path(scenario_arg).write_text(SLOW_DECODE if case.scenario == "slow" else LONG_CONTEXT)
    if scenario_arg is not None:
        flags += ["--scenario", scenario_arg]
    trace = None
    if case.rate:
        trace = work / f"{case.name}.csv"
        if case.shape == "burst":
            burst_trace(trace, case.rate, case.span_s)
        else:
            reasoning_trace(trace, case.rate, case.span_s, case.outputs)
        flags += ["--trace", str(trace)]
    t0 = time.perf_counter()
    # The tree this script imported, not the working directory, which "-c" puts first
    # on the path: a "before" run from a newer tree's root ran the newer code.
    out = subprocess.run([sys.executable, "-P", "-c", CLI, "tune", *flags, "--trials", str(trials),
                          "--max-replicas", "1", "--json", "--quiet"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(TREE)})
    tune_s = time.perf_counter() - t0
    study = json.loads(out.stdout)
    options = TraceOptions(path=None if trace is None else str(trace))
    scenario = load_with_trace(scenario_arg, options, default="")
    t0 = time.perf_counter()
    whole = simulate(scenario, study["best"]["config"], measure=replay_measure(scenario))
    check_s = time.perf_counter() - t0
    replay = simulate_json(whole.summary, scenario.slo)
    # The longest warm-up: a window near the trace's start has only what lies before it.
    return {"case": case.name, "kind": study["windows_kind"],
            "warmup_s": max(w["warmup_s"] for w in study["windows"]),
            "drain_s": study["windows"][0]["drain_s"], "feasible": study["feasible"],
            "verdict": study["verdict"], "warnings": study.get("warnings", []),
            "share": study["best"]["goodput_share_worst_window"],
            "windows_kv_max": max(w["summary"]["kv_usage_max"]
                                  for w in study["best"]["windows"]),
            "windows_ttft_p99_ms": max(w["summary"]["ttft_p99_ms"] or 0.0
                                       for w in study["best"]["windows"]),
            "simulated_s": study["timing"]["simulated_s"],
            "evaluations": study["timing"]["evaluations"], "tune_s": tune_s,
            "whole_holds": replay["p99_within_slo"], "whole_ttft_p99_ms": replay["ttft_p99_ms"],
            "whole_kv_max": replay["kv_usage_max"], "check_s": check_s,
            "agree": study["feasible"] == replay["p99_within_slo"]}


def chosen_cases(ap: argparse.ArgumentParser, text: str, names: list[str]) -> list[str]:
    """``--cases``' comma-separated names, each one of ``names`` (else argparse's error)."""
    wanted = text.split(",")
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        ap.error(f"--cases {','.join(unknown)}: no such case; pick from {', '.join(names)}")
    return wanted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--out", type=Path, default=Path("out/window_transfer"))
    args = ap.parse_args()
    wanted = chosen_cases(ap, args.cases, [c.name for c in CASES])
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| case | judged on | warm-up / drain (s) | tune: holds | windows: KV max, TTFT p99 "
          "| goodput share | whole: holds | whole: KV max, TTFT p99 | agree | tune (s) | "
          "check (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        if case.name not in wanted:
            continue
        r = run_case(case, args.trials, args.out)
        rows.append(r)
        print(f"| {r['case']} | {r['kind']} | {r['warmup_s']:g} / {r['drain_s']:.0f} | "
              f"{'yes' if r['feasible'] else 'no'} | {r['windows_kv_max']:.0%}, "
              f"{r['windows_ttft_p99_ms'] / 1000:.2f} s | {r['share'] or 0:.2f} | "
              f"{'yes' if r['whole_holds'] else 'no'} | {r['whole_kv_max']:.0%}, "
              f"{r['whole_ttft_p99_ms'] / 1000:.2f} s | {'yes' if r['agree'] else '**no**'} | "
              f"{r['tune_s']:.0f} | {r['check_s']:.0f} |", flush=True)
    (args.out / "window_transfer.json").write_text(json.dumps(rows, indent=1))
    agreed = sum(r["agree"] for r in rows)
    print(f"RESULT cases={len(rows)} agree={agreed} disagree={len(rows) - agreed} "
          f"tune_s={sum(r['tune_s'] for r in rows):.0f} "
          f"simulated_s={sum(r['simulated_s'] for r in rows):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
