"""Whether the sustained-breach alert the loop reads after a cooldown judges the config
that took effect, through promtool on the rendered rules.

A deployment serves P0 and P1 at a 2.0 s time to first token until an action takes
effect at A = 20m20s (new replicas serving, a config live), 0.3 s after; the engine's
real ``EngineMetrics`` is scraped every 15 s and the rules (``render_rule_groups``, the
demo scenario's SLO: P0 800 ms) are evaluated every 30 s. At each read time it asks
promtool for P0's ``slopilot:ttft_seconds:p99_long`` and for ``timestamp(ALERTS)`` of the
firing ``SlopilotTTFTP99Sustained``: when the verdict read was evaluated. The loop's
first read after a 300 s cooldown is a 5 s tick later, at A+305 s. Printed per read:
the figure, the verdict's age and where its 5 min window starts, and whether the loop
acts on it: before (counted ``breach_window_s`` on its own clock since the action) and
now (``steady._read_after``: the window of the last evaluation starts after the action).

    .venv/bin/python benchmarks/alert_eval_lag.py

Ends with ``RESULT`` and the reads acted on before and now. Needs ``promtool``.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.prometheus.rules import render_rule_groups

SLO = load_scenario("demo").slo
A = 20 * 60 + 20
"""When the action takes effect, seconds into the run."""
SCRAPE_S, EVALUATION = 15, "30s"
BREACH_S = 300
READS = {"25m": 1500, "25m25s": 1525, "25m30s": 1530, "26m": 1560}
NAME = "SlopilotTTFTP99Sustained"
SERIES = ("vllm:time_to_first", "vllm:inter_token", "vllm:num_requests",
          "vllm:generation_tokens", "slopilot_requests")


def series(minutes: int = 28) -> list[dict[str, str]]:
    """promtool's input series: every scrape of one engine's exposition."""
    m = EngineMetrics("m")
    m.set_slo(SLO)
    rnd = random.Random(1)
    out: dict[str, list[str]] = {}
    t = 0
    lab = 'instance="a",slopilot_deployment="d"'
    for k in range(minutes * 60 // SCRAPE_S + 1):
        t_end = k * SCRAPE_S
        while t < t_end:
            t += 1
            for _ in range(2):
                for p in (Priority.P0, Priority.P1):
                    tt = (2.0 if t <= A else 0.3) * rnd.uniform(0.95, 1.05)
                    m.on_first_token(p, tt, 1, prompt_tokens=100)
                    for _ in range(9):
                        m.on_token_gap(p, 0.02, t)
                    m.on_finished(p, e2e_s=tt + .2, queue_s=.01, prompt_tokens=100,
                                  generation_tokens=10, finish_reason="stop")
                    m.observe_verdict(p, SLO.class_slo(p), met=tt < .8, tokens=10)
        m.on_step(now=t_end, elapsed_s=.5, num_running=3, num_waiting=0, num_swapped=0,
                  kv_usage=.1, iteration_tokens=4, num_preempted_recompute=0,
                  num_preempted_swap=0, swap_s=0., prefix_queries=0, prefix_hits=0)
        out.setdefault(f"up{{{lab}}}", []).append("1")
        for line in m.render().decode().splitlines():
            mt = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$", line)
            if not mt or mt.group(1).endswith("_created") or not mt.group(1).startswith(SERIES):
                continue
            inner = mt.group(3)
            key = f'{mt.group(1)}{{{lab}{"," + inner if inner else ""}}}'
            out.setdefault(key, []).append(mt.group(4))
    return [{"series": s, "values": " ".join(v)} for s, v in out.items()]


def promtool(workdir: Path) -> str:
    """promtool's report of every expression read at every read time (each expects
    nothing, so that promtool prints what it got)."""
    (workdir / "rules.yaml").write_text(yaml.safe_dump(
        render_rule_groups(SLO, "d", selector={"slopilot_deployment": "d"}), sort_keys=False))
    inp = series()
    sel = f'alertname="{NAME}",alertstate="firing",priority_class="p0"'
    tests: dict[str, Any] = {"rule_files": ["rules.yaml"], "evaluation_interval": EVALUATION,
                             "tests": []}
    for at in READS:
        tests["tests"].append({"interval": f"{SCRAPE_S}s", "input_series": inp,
                               "promql_expr_test": [
            {"expr": 'slopilot:ttft_seconds:p99_long{priority_class="p0"}', "eval_time": at,
             "exp_samples": []},
            {"expr": f"timestamp(ALERTS{{{sel}}})", "eval_time": at, "exp_samples": []}]})
    (workdir / "test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(["promtool", "test", "rules", "test.yaml"], cwd=workdir,
                          capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def got(report: str, expr: str, at: str) -> float | None:
    found = re.search(re.escape(expr) + r"[^\n]*time: " + re.escape(at)
                      + r",\s*exp: nil\s*got: \{[^}]*\} (\S+)", report)
    return float(found.group(1)) if found else None


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = promtool(Path(tmp))
    before, now_ = [], []
    for at, t in READS.items():
        p99 = got(report, "slopilot:ttft_seconds:p99_long", at)
        evaluated = got(report, "timestamp(ALERTS", at)
        if p99 is None:
            print(f"promtool said nothing of the P99 at {at}:\n{report}", file=sys.stderr)
            return 1
        if evaluated is None:
            print(f"A+{t - A}s: P0 p99_long {p99:.3f} s; {NAME}[p0] not firing")
            continue
        ago = t - evaluated
        acted_before = t - A >= BREACH_S
        acted_now = evaluated - BREACH_S >= A  # steady._read_after
        if acted_before:
            before.append(t - A)
        if acted_now:
            now_.append(t - A)
        print(f"A+{t - A}s: P0 p99_long {p99:.3f} s; {NAME}[p0] firing, evaluated "
              f"{ago:.0f} s before (window from A{evaluated - BREACH_S - A:+.0f} s); acted "
              f"on before: {'yes' if acted_before else 'no'}, now: "
              f"{'yes' if acted_now else 'no'}")
    print(f"RESULT acted_before={','.join(f'A+{x}' for x in before) or 'none'} "
          f"acted_now={','.join(f'A+{x}' for x in now_) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
