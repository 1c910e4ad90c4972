"""Verdict transfer on traces tune was not built around: a code assistant's (BurstGPT's CSV)
and a chat service's with shared prefixes (Mooncake's JSONL), side by side.

Per case, ``slopilot tune`` runs as a user would (the trace, a deployment, ``--trials``,
``--seed 0``, the default capacity search), and every (config, replicas) it judged and
reported is replayed over the WHOLE trace, as its ``check_command`` does: the best config
on one replica, and the capacity search's config on every count it tried. For each:

- tune's verdict (holds the SLO in every window with 10 % headroom, or not) and its worst
  window's P99 TTFT and TBT, by tune's own evaluator on tune's own windows (checked
  against the JSON it printed);
- the whole replay's P99s, its verdict as ``simulate`` prints it (``p99 within SLO``) and
  by tune's rule (every term within 90 % of its limit);
- the same windows read from the whole replay (the P99 of the requests arriving in each,
  served on the engine the whole trace drove) and its worst minute (60 s on a 10 s grid).

Agreement: tune's verdict against the whole replay's (both ways: "holds" over a whole
replay that misses is a forward failure, the harmful kind; "misses" over one that holds
is a reverse one). At the minute too: "holds" where the whole replay's worst minute
misses the TTFT target is a minute-level forward failure. And as the loop would act:
the shipped alert table's latency rows evaluated over the whole replay as Prometheus
evaluates them (every 30 s, P99s read from the engine's buckets over the 60 s and 300 s
windows, each row's hold: ``acting_alerts``); "holds" where one that acts (retune,
scale) fires is an alert-level forward failure. A minute just over the TTFT target only
informs, and only if it lasts the 2 minutes' hold. P99 errors: tune's worst window
against the whole trace's P99 and against the same windows of the whole replay; the
tolerance is tune's headroom (10 %): an error beyond it is one the headroom does not
cover.

Cases: ``code``, ``benchmarks/code_trace.py``'s trace (seed 0, 40 minutes, BurstGPT's
CSV) on a bare ``--trace`` (azure-conv-2023's deployment: 1 x H100, Llama-3-8B, P1 TTFT
500 ms), as docs/tuning.md tunes Azure's code trace; ``mooncake``, a seeded chat trace in
Mooncake's JSONL (30 minutes: quiet for 10 at 0.2 req/s, then 1 req/s with bursts of
15-30 requests; 60 % of turns follow up one of 40 recent sessions, every prompt opens
with 4 shared system-prompt blocks) on ``long-context`` (Llama-3.1-70B on 4 x H100, P1
TTFT 8 s), the shipped deployment for long prompts and short answers; and
``mooncake-shift``, a Mooncake trace whose busiest minutes by tokens are follow-ups the
prefix cache serves and whose hardest are two minutes of fresh documents, on a bare
``--trace`` (the case that ranking minutes by prompt tokens got wrong).

    .venv/bin/python benchmarks/tune_transfer.py [--trials 10] [--cases code,...] [--out DIR]

Ends with ``RESULT cases=... judged=... agree_check=... agree_headroom=... forward_fail=...
reverse=... minute_forward_fail=... alert_forward_fail=... ttft_err_whole_max=...
ttft_err_windows_max=... tbt_err_windows_max=...``.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from code_trace import HEADER, code_trace
from window_transfer import chosen_cases

import slopilot
from slopilot.engine.histogram_quantiles import latency_quantile
from slopilot.engine.request import Priority, Request
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.summary_view import simulate_json
from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace, replay_measure
from slopilot.engine.sim.workload_spec import TraceSpec
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import Window, WindowSummary
from slopilot.tuner.prometheus.alert_table import RuleOptions
from slopilot.tuner.prometheus.alerts import Alert, AlertAction, SummaryAlerts
from slopilot.tuner.prometheus.query import window_summary
from slopilot.tuner.sim.robust import RobustEvaluator, plan_windows
from slopilot.tuner.study.objective import HEADROOM, WindowResult, score
from slopilot.tuner.study.verdict import robust_verdict

TREE = Path(slopilot.__file__).resolve().parents[1]
"""The slopilot tree this script runs: its studies run the same one."""

CLI = "import sys; from slopilot.cli import main; sys.argv[0] = 'slopilot'; sys.exit(main())"
MINUTE_S, GRID_S = 60.0, 10.0


def write_code(path: Path) -> None:
    """``code_trace.py --seed 0`` (40 minutes), BurstGPT's CSV."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for at, prompt, output in code_trace(0, 40.0):
            w.writerow((f"{at:.3f}", "code-model", prompt, output, prompt + output, "API log"))


def _write_jsonl(path: Path, rows: list[tuple[float, list[int], int, int]]) -> None:
    path.write_text("".join(json.dumps({"timestamp": round(at * 1000), "input_length": n,
                                        "output_length": out, "hash_ids": blocks}) + "\n"
                            for at, blocks, n, out in sorted(rows)))


def write_mooncake(path: Path, seed: int = 0) -> None:
    """A chat service's 30 minutes in Mooncake's JSONL (the module docstring)."""
    rng = np.random.default_rng(seed)
    times, t = [], 0.0
    while (t := t + rng.exponential(1 / (0.2 if t < 600 else 1.0))) < 1800:
        times.append(t)
    burst = 600 + rng.exponential(90.0)
    while burst < 1800:
        times += list(burst + np.sort(rng.uniform(0, 2.0, int(rng.integers(15, 31)))))
        burst += rng.exponential(90.0)
    system, next_id = [0, 1, 2, 3], 4
    sessions: list[list[int]] = []
    rows = []
    for at in sorted(x for x in times if x < 1800):
        k: int | None = None
        if sessions and rng.random() < 0.6:
            k = int(rng.integers(max(0, len(sessions) - 40), len(sessions)))
            blocks = sessions[k] + list(range(next_id, next_id + int(rng.integers(1, 5))))
        else:
            fresh = max(1, int(rng.lognormal(np.log(8), 0.6)))
            blocks = system + list(range(next_id, next_id + fresh))
        if len(blocks) > 64:  # a context past 32k tokens: the user starts over
            k, blocks = None, system + list(range(next_id, next_id + 8))
        next_id = max(next_id, max(blocks) + 1)
        if k is None:
            sessions.append(blocks)
        else:
            sessions[k] = blocks
        rows.append((float(at), blocks, len(blocks) * 512 - int(rng.integers(0, 512)),
                     int(np.clip(rng.lognormal(np.log(150), 0.8), 1, 2000))))
    _write_jsonl(path, rows)


def write_mooncake_shift(path: Path, seed: int = 0) -> None:
    """Quiet (0.5 req/s of fresh 2-4k-token prompts) but for 10 minutes of follow-ups at
    8 req/s in 30 sessions of 3-7k-token contexts, each turn one new block (~50,000
    prompt tokens a second, ~4,000 of them new), and then 2 minutes of fresh documents at
    5 req/s of 4-7k tokens (~28,000 a second, all new); 30 minutes in all."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, list[int], int, int]] = []
    next_id = 0

    def fresh(k: int) -> list[int]:
        nonlocal next_id
        next_id += k
        return list(range(next_id - k, next_id))

    def add(at: float, blocks: list[int]) -> None:
        rows.append((at, blocks, len(blocks) * 512 - int(rng.integers(0, 512)),
                     int(np.clip(rng.lognormal(np.log(60), 0.7), 1, 400))))

    t = 0.0
    while (t := t + rng.exponential(2.0)) < 1800:
        if not 900 <= t < 1620:
            add(t, fresh(int(rng.integers(4, 9))))
    sessions = [fresh(int(rng.integers(6, 10))) for _ in range(30)]
    for s in sessions:
        add(880 + rng.uniform(0, 20), list(s))
    t = 900.0
    while (t := t + rng.exponential(1 / 8)) < 1500:
        k = int(rng.integers(0, 30))
        sessions[k] = (sessions[k] if len(sessions[k]) < 14 else sessions[k][:8]) + fresh(1)
        add(t, list(sessions[k]))
    t = 1500.0
    while (t := t + rng.exponential(1 / 5)) < 1620:
        add(t, fresh(int(rng.integers(8, 14))))
    _write_jsonl(path, rows)


@dataclass(frozen=True)
class Case:
    name: str
    form: str
    """The trace's format, as docs/traces.md names it."""
    suffix: str
    write: Callable[[Path], None]
    scenario: str | None
    """None: a bare ``--trace`` (azure-conv-2023's deployment)."""


CASES = (
    Case("code", "BurstGPT CSV", ".csv", write_code, None),
    Case("mooncake", "Mooncake JSONL", ".jsonl", write_mooncake, "long-context"),
    Case("mooncake-shift", "Mooncake JSONL", ".jsonl", write_mooncake_shift, None),
)


class Latencies:
    """Every first-token time and token gap of a run, by its request's arrival: a window
    of the whole replay read afterwards, as tune's windows read their own runs. Per class
    also by when each was observed (``seen``), as the engine's histograms take them: what
    the live alert rules read."""

    def __init__(self) -> None:
        self.ttft: list[tuple[float, float]] = []
        self.tbt: list[tuple[float, float]] = []
        self.classes: set[Priority] = set()
        self.seen: dict[Priority, Observed] = {p: Observed() for p in Priority}

    def on_step(self, *_: Any) -> None:
        pass

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.append((req.arrival_time, ttft_s))
        self.classes.add(req.priority)
        self.seen[req.priority].ttft.append((now, ttft_s))

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        self.tbt.append((req.arrival_time, gap_s))
        self.seen[req.priority].tbt.append((now, gap_s))

    def on_finished(self, req: Request, now: float) -> None:
        pass

    @staticmethod
    def p99_ms(rows: list[tuple[float, float]], start: float, end: float) -> float | None:
        v = [x for t, x in rows if start <= t < end]
        return float(np.percentile(v, 99)) * 1000 if v else None


@dataclass
class Observed:
    """One class's first-token times and token gaps, each at the time it was observed."""

    ttft: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    tbt: list[tuple[float, float]] = dataclasses.field(default_factory=list)


def _in(rows: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """The values observed in ``(start, end]`` of rows in observation order."""
    lo = bisect.bisect_right(rows, (start, math.inf))
    hi = bisect.bisect_right(rows, (end, math.inf))
    return [v for _, v in rows[lo:hi]]


def _window(seen: Mapping[Priority, Observed], start: float, end: float) -> WindowSummary:
    """The window ``(start, end]`` as Prometheus' recorded series read it: each class's
    P99s from the engine's latency buckets (``histogram_quantile``)."""
    ttft = {p.label: _in(o.ttft, start, end) for p, o in seen.items()}
    tbt = {p.label: _in(o.tbt, start, end) for p, o in seen.items()}
    return window_summary(
        requests={c: float(len(v)) for c, v in ttft.items()}, throughput={},
        ttft_p99_s={c: latency_quantile(0.99, v) for c, v in ttft.items()},
        tbt_p99_s={c: latency_quantile(0.99, v) for c, v in tbt.items()}, goodput={},
        preemptions_per_min=math.nan, overall_ttft_p99_s=math.nan,
        overall_tbt_p99_s=math.nan, duration_s=end - start, window=Window(start, end))


SHIPPED_RULES = RuleOptions()
"""The alerts' timing and thresholds an LLMDeployment gets when it sets none."""


def acting_alerts(seen: Mapping[Priority, Observed], slo: SLOSpec,
                  options: RuleOptions = SHIPPED_RULES) -> list[Alert]:
    """The shipped alert table's latency rows over a whole replay, evaluated every
    ``interval_s`` as Prometheus evaluates them (``SummaryAlerts``: ``rate_window_s`` and
    ``breach_window_s`` windows, each row's hold): the firings that act (retune, scale),
    the first of each alert. Evaluated until the last observation has left the long
    window, as on a deployment whose traffic stops where the trace does: a breach at the
    trace's end still holds for its hold. Its other rows (preemptions, utilization,
    prefix hits) read no data here and do not fire."""
    for o in seen.values():
        o.ttft.sort()
        o.tbt.sort()
    last = max((rows[-1][0] for o in seen.values() for rows in (o.ttft, o.tbt) if rows),
               default=0.0)
    alerts = SummaryAlerts(slo, options)
    first: dict[tuple[str, str, str], tuple[float, Alert]] = {}
    step = float(options.interval_s)
    for now in np.arange(step, last + options.breach_window_s + step, step):
        t = float(now)
        for a in alerts.evaluate(_window(seen, t - options.rate_window_s, t), t,
                                 _window(seen, t - options.breach_window_s, t)):
            if a.action is not AlertAction.INFORM:
                first.setdefault((a.name, a.priority_class, a.severity), (t, a))
    return [a for _, a in sorted(first.values(), key=lambda ta: ta[0])]


def _worst(values: list[float | None]) -> float:
    return max(v for v in values if v is not None)


def _err(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def judge(scenario: Scenario, evaluator: RobustEvaluator, windows: list[dict[str, Any]],
          label: str, config: Mapping[str, Any], replicas: int,
          told: bool | None) -> dict[str, Any]:
    """Tune's verdict on (config, replicas), by its own evaluator, against the whole replay."""
    t0 = time.perf_counter()
    tuned = evaluator.at_replicas(replicas).evaluate(config)
    if told is not None and tuned.feasible != told:
        raise SystemExit(f"{label} on {replicas}: the evaluator says {tuned.feasible}, tune "
                         f"printed {told}: the windows are not tune's")
    tune_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    seen = Latencies()
    whole = simulate(scenario, config, replicas=replicas, measure=replay_measure(scenario),
                     observers=[seen])
    check_s = time.perf_counter() - t0
    replay = simulate_json(whole.summary, scenario.slo)
    by_rule = robust_verdict(config, [WindowResult("whole trace", "whole trace",
                                                   score(whole.summary, scenario.slo,
                                                         config=dict(config)))],
                             HEADROOM).feasible
    summaries = [w.result.summary for w in tuned.windows]
    t_ttft = _worst([s.overall.ttft_p99_ms for s in summaries if s is not None])
    t_tbt = _worst([s.overall.tbt_p99_ms for s in summaries if s is not None])
    same = [(Latencies.p99_ms(seen.ttft, w["start_s"], w["end_s"]),
             Latencies.p99_ms(seen.tbt, w["start_s"], w["end_s"])) for w in windows]
    span = max(t for t, _ in seen.ttft)
    minutes = [(s, Latencies.p99_ms(seen.ttft, s, s + MINUTE_S))
               for s in np.arange(0.0, max(span - MINUTE_S, 0.0) + GRID_S, GRID_S)]
    worst_at, worst_ttft = max(((s, v) for s, v in minutes if v is not None),
                               key=lambda sv: sv[1])
    w_ttft, w_tbt = _worst([a for a, _ in same]), _worst([b for _, b in same])
    # The worst minute against the tightest TTFT target of the classes it served (the
    # cases' traces are all P1's): what a minute's P99 alert would fire on.
    limits = [scenario.slo.class_slo(p).ttft_p99_ms for p in seen.classes]
    minute_limit = min(v for v in limits if v is not None)
    acted = acting_alerts(seen.seen, scenario.slo)
    return {"config": label, "replicas": replicas, "tune_holds": tuned.feasible,
            "tune_ttft_p99_ms": t_ttft, "tune_tbt_p99_ms": t_tbt,
            "whole_ttft_p99_ms": replay["ttft_p99_ms"], "whole_tbt_p99_ms": replay["tbt_p99_ms"],
            "whole_holds": bool(replay["p99_within_slo"]), "whole_holds_headroom": by_rule,
            "windows_in_whole_ttft_p99_ms": w_ttft, "windows_in_whole_tbt_p99_ms": w_tbt,
            "worst_minute_s": float(worst_at), "worst_minute_ttft_p99_ms": worst_ttft,
            "worst_minute_holds": worst_ttft <= minute_limit,
            "acting_alerts": [f"{a.describe()} from {a.since:,.0f} s" for a in acted],
            "goodput_share": tuned.objective,
            "ttft_err_whole": _err(t_ttft, replay["ttft_p99_ms"]),
            "ttft_err_windows": _err(t_ttft, w_ttft), "tbt_err_windows": _err(t_tbt, w_tbt),
            "tune_s": tune_s, "check_s": check_s}


def run_case(case: Case, trials: int, work: Path) -> dict[str, Any]:
    trace = work / f"{case.name}{case.suffix}"
    case.write(trace)
    flags = ["--trace", str(trace)] + ([] if case.scenario is None
                                        else ["--scenario", case.scenario])
    t0 = time.perf_counter()
    # The tree this script imported, not the working directory, which "-c" puts first
    # on the path: a "before" run from a newer tree's root ran the newer code.
    out = subprocess.run([sys.executable, "-P", "-c", CLI, "tune", *flags, "--trials", str(trials),
                          "--seed", "0", "--json", "--quiet"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(TREE)})
    tune_s = time.perf_counter() - t0
    study = json.loads(out.stdout)
    scenario = load_with_trace(case.scenario, TraceOptions(path=str(trace)), default="")
    plan = plan_windows(scenario)
    if [dataclasses.asdict(w) for w in plan.windows] != study["windows"]:
        raise SystemExit(f"{case.name}: the windows rebuilt here are not tune's "
                         f"({study['judged_on']})")
    evaluator = RobustEvaluator(scenario, plan)
    assert isinstance(scenario.workload, TraceSpec)
    judged = [judge(scenario, evaluator, study["windows"], study["best_candidate"],
                    study["best"]["config"], 1, study["feasible"])]
    cap = study["capacity"]
    if cap is not None:
        for n, tried in sorted(cap["tried"].items(), key=lambda kv: int(kv[0])):
            judged.append(judge(scenario, evaluator, study["windows"], cap["candidate"],
                                cap["config"], int(n), tried["feasible"]))
    return {"case": case.name, "form": case.form,
            "deployment": case.scenario or "azure-conv-2023 (bare --trace)",
            "requests": len(scenario.workload.records()),
            "judged_on": study["judged_on"], "verdict": study["verdict"],
            "recommended_replicas": study["recommended_replicas"],
            "check_command": study["check_command"], "tune_s": tune_s, "judged": judged}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--out", type=Path, default=Path("out/tune_transfer"))
    args = ap.parse_args()
    wanted = chosen_cases(ap, args.cases, [c.name for c in CASES])
    if args.trials < 1:
        ap.error(f"--trials {args.trials}: give at least 1, e.g. 10")
    args.out.mkdir(parents=True, exist_ok=True)
    cases = []
    for case in CASES:
        if case.name not in wanted:
            continue
        r = run_case(case, args.trials, args.out)
        cases.append(r)
        print(f"\n### {r['case']} ({r['form']}, {r['requests']:,} requests, on "
              f"{r['deployment']}; tune {r['tune_s']:.0f} s)\n\n{r['judged_on']}\n\n"
              f"> {r['verdict']}\n")
        print("| config | replicas | tune: holds | tune: worst window TTFT / TBT p99 | "
              "whole: TTFT / TBT p99 | whole: holds (SLO / headroom) | same windows in "
              "whole: TTFT / TBT p99 | whole: worst minute TTFT p99 | whole: alerts that "
              "act | TTFT err vs whole / vs windows | TBT err vs windows |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for j in r["judged"]:
            print(f"| {j['config']} | {j['replicas']} | {'yes' if j['tune_holds'] else 'no'} | "
                  f"{_ms(j['tune_ttft_p99_ms'])} / {_ms(j['tune_tbt_p99_ms'])} | "
                  f"{_ms(j['whole_ttft_p99_ms'])} / {_ms(j['whole_tbt_p99_ms'])} | "
                  f"{'yes' if j['whole_holds'] else 'no'} / "
                  f"{'yes' if j['whole_holds_headroom'] else 'no'} | "
                  f"{_ms(j['windows_in_whole_ttft_p99_ms'])} / "
                  f"{_ms(j['windows_in_whole_tbt_p99_ms'])} | "
                  f"{_ms(j['worst_minute_ttft_p99_ms'])} ({j['worst_minute_s']:,.0f} s) | "
                  f"{', '.join(j['acting_alerts']) or 'none'} | "
                  f"{j['ttft_err_whole']:+.0%} / {j['ttft_err_windows']:+.0%} | "
                  f"{j['tbt_err_windows']:+.0%} |", flush=True)
    (args.out / "tune_transfer.json").write_text(json.dumps(cases, indent=1))
    judged = [j for r in cases for j in r["judged"]]
    # The answer each case printed (its replicas, and a config that holds there).
    answers = [j for r in cases for j in r["judged"]
               if j["replicas"] == r["recommended_replicas"] and j["tune_holds"]]
    recommended, recommended_hold = len(answers), sum(j["whole_holds"] for j in answers)
    print(f"\nRESULT cases={len(cases)} judged={len(judged)} "
          f"agree_check={sum(j['tune_holds'] == j['whole_holds'] for j in judged)} "
          f"agree_headroom={sum(j['tune_holds'] == j['whole_holds_headroom'] for j in judged)} "
          f"forward_fail={sum(j['tune_holds'] and not j['whole_holds'] for j in judged)} "
          f"reverse={sum(not j['tune_holds'] and j['whole_holds'] for j in judged)} "
          f"minute_forward_fail="
          f"{sum(j['tune_holds'] and not j['worst_minute_holds'] for j in judged)} "
          f"alert_forward_fail={sum(j['tune_holds'] and bool(j['acting_alerts']) for j in judged)} "
          f"ttft_err_whole_max={max(abs(j['ttft_err_whole']) for j in judged):.3f} "
          f"ttft_err_windows_max={max(abs(j['ttft_err_windows']) for j in judged):.3f} "
          f"tbt_err_windows_max={max(abs(j['tbt_err_windows']) for j in judged):.3f} "
          f"recommended_hold={recommended_hold}/{recommended} "
          f"tune_s={sum(r['tune_s'] for r in cases):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
