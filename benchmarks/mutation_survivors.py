"""Can the tests fail? Plausible one-line mutations of the code they guard, each run
against the tests that should catch it; a mutation the tests pass is a survivor.

Each mutation is one exact, unique text replacement (an off-by-one, a flipped
comparison, a dropped label, swapped classes) in one source file. The file is restored
after its run, whatever happens (Ctrl-C and SIGTERM included), and the script refuses to
start on a tree with uncommitted changes under slopilot/, so a restore can never lose
work. One pytest run at a time (``-x``: the first failure kills the mutation).

    .venv/bin/python benchmarks/mutation_survivors.py [--only NAME ...]

Ends with ``RESULT mutations=N killed=K survived=S survivors=a,b``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCHED = ("tests/engine/test_scheduler.py", "tests/engine/test_scheduler_budget_cut.py",
         "tests/engine/test_scheduler_class_order.py",
         "tests/engine/test_scheduler_priority.py",
         "tests/engine/test_scheduler_properties.py", "tests/engine/test_block_manager.py",
         "tests/engine/test_prefix_cache.py")
METRICS = ("tests/engine/test_metrics.py", "tests/engine/test_slo.py",
           "tests/engine/server/test_admin_slo.py")
TUNER = ("tests/tuner/test_objective.py", "tests/tuner/test_verdict.py",
         "tests/tuner/test_space.py", "tests/tuner/test_controller.py",
         "tests/tuner/test_transitions.py", "tests/tuner/test_scaling_down.py",
         "tests/tuner/test_loop_state.py", "tests/tuner/test_loop_backoff.py")
WINDOWS = ("tests/engine/sim/test_windows.py",)
OPERATOR = ("tests/operator/test_policy.py", "tests/operator/test_render.py",
            "tests/operator/test_crd.py", "tests/operator/test_manifests.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


M = Mutation
MUTATIONS = (
    M("can_ever_fit", "slopilot/engine/scheduler.py", "return num_tokens + 1 <= self.kv",
      "return num_tokens <= self.kv", SCHED),
    M("decode_room", "slopilot/engine/scheduler.py", "if computed < len(table) * bs:",
      "if computed <= len(table) * bs:", SCHED),
    M("victim_first", "slopilot/engine/scheduler.py",
      "if not self._preempt(self.running[-1]):", "if not self._preempt(self.running[0]):",
      SCHED),
    M("grow_cap", "slopilot/engine/scheduler.py",
      "if req.num_computed_tokens + n > self.kv.num_gpu_blocks",
      "if req.num_computed_tokens + n >= self.kv.num_gpu_blocks", SCHED),
    M("trim_minus_1", "slopilot/engine/scheduler.py", "self._trim_running(budget)",
      "self._trim_running(budget - 1)", SCHED),
    M("rank_arrival_first", "slopilot/engine/scheduler_base.py",
      "return (req.priority, req.arrival_time, req.seq_no)",
      "return (req.arrival_time, req.priority, req.seq_no)", SCHED),
    M("cap_gt", "slopilot/engine/scheduler_base.py",
      ">= self.config.max_preemptions_per_step and",
      "> self.config.max_preemptions_per_step and", SCHED),
    M("auto_le", "slopilot/engine/preemption.py",
      "if victim.num_computed_tokens < config.recompute_max_tokens",
      "if victim.num_computed_tokens <= config.recompute_max_tokens", SCHED),
    M("newcomer_waits_not", "slopilot/engine/preemption.py",
      "return None if newcomer else PreemptionMode.RECOMPUTE",
      "return PreemptionMode.RECOMPUTE", SCHED),
    M("watermark_when_idle", "slopilot/engine/admission.py", "if self.running else 0",
      "if True else 0", SCHED),
    M("p0_util_ge", "slopilot/engine/admission.py",
      "kv.usage > cfg.p0_preempt_utilization", "kv.usage >= cfg.p0_preempt_utilization",
      SCHED),
    M("p0_takes_p0", "slopilot/engine/admission.py",
      "if victim is None or victim.priority <= req.priority:",
      "if victim is None or victim.priority < req.priority:", SCHED),
    M("drop_reviving", "slopilot/engine/block_manager.py",
      "if need + reviving + reserve_blocks >", "if need + reserve_blocks >", SCHED),
    M("free_head_first", "slopilot/engine/block_manager.py", "for b in reversed(table):",
      "for b in table:", SCHED),
    M("swap_exact_fit", "slopilot/engine/block_manager.py",
      "return self.num_blocks(request_id) <= self.num_free_cpu_blocks",
      "return self.num_blocks(request_id) < self.num_free_cpu_blocks", SCHED),
    M("swap_in_no_reserve", "slopilot/engine/block_manager.py",
      "if len(cpu) + reserve_blocks > self.num_free_blocks:",
      "if len(cpu) > self.num_free_blocks:", SCHED),
    M("evict_mru", "slopilot/engine/block_manager.py",
      "b, _ = self._cached.popitem(last=False)", "b, _ = self._cached.popitem(last=True)",
      SCHED),
    M("exclusive_counts_shared", "slopilot/engine/block_manager.py", "if ref[b] == 1)",
      "if ref[b] >= 1)", SCHED),
    M("bucket_le", "slopilot/engine/metric_window.py",
      "self.counts[bisect_left(self.edges, value)] += 1",
      # bisect_right: a value on an edge counted in the bucket above it.
      "self.counts[bisect_left(self.edges, value) + (value in self.edges)] += 1", METRICS),
    M("quantile_rank", "slopilot/engine/histogram_quantiles.py",
      "i = bisect.bisect_left(counts, rank)", "i = bisect.bisect_right(counts, rank)", METRICS),
    M("classes_swapped", "slopilot/engine/metrics.py", "p.label], recorders[p]) for p in Priority",
      "p.label], recorders[Priority(len(Priority) - 1 - p)]) for p in Priority", METRICS),
    M("verdict_label", "slopilot/engine/verdicts.py", '"true" if met else "false"]',
      '"true"]', METRICS),
    M("met_tbt_lt", "slopilot/engine/slo.py",
      "return ttft_ok and gaps_over_tbt <= 0.01 * gaps",
      "return ttft_ok and gaps_over_tbt < 0.01 * gaps", METRICS),
    M("met_ttft_lt", "slopilot/engine/slo.py", "ttft_s <= self.ttft_p99_ms / 1000.0",
      "ttft_s < self.ttft_p99_ms / 1000.0", METRICS),
    M("preemption_limit_max", "slopilot/engine/slo.py",
      "return min(limits) if limits else None", "return max(limits) if limits else None",
      METRICS),
    M("judge_gap_ge", "slopilot/engine/slo.py", "if limit is not None and gap_s > limit:",
      "if limit is not None and gap_s >= limit:", METRICS),
    M("feasible_lt", "slopilot/tuner/study/objective.py",
      "feasible=all(c <= 0.0 for c in constraints),",
      "feasible=all(c < 0.0 for c in constraints),", TUNER),
    M("holds_sign", "slopilot/tuner/study/objective.py",
      "return all(c <= -margin for c in result.constraints)",
      "return all(c <= margin for c in result.constraints)", TUNER),
    M("unmeasured_any", "slopilot/tuner/study/objective.py",
      "if set_by_slo and all(value is None for value in set_by_slo):",
      "if set_by_slo and any(value is None for value in set_by_slo):", TUNER),
    M("tbt_term_limit", "slopilot/tuner/study/objective.py",
      "constraints.append(_term(figures.tbt_p99_ms, c.tbt_p99_ms))",
      "constraints.append(_term(figures.tbt_p99_ms, c.ttft_p99_ms))", TUNER),
    M("budget_grid_top", "slopilot/tuner/study/space.py",
      "range(max(first, 1), b.hi // a + 1)", "range(max(first, 1), b.hi // a)", TUNER),
    M("cooldown_le", "slopilot/tuner/loop/steady.py",
      "tick.now < loop.cooldown_until:", "tick.now <= loop.cooldown_until:", TUNER),
    M("min_replicas_lt", "slopilot/tuner/loop/steady.py", "if current <= s.min_replicas:",
      "if current < s.min_replicas:", TUNER),
    M("transition_row", "slopilot/tuner/loop/transitions.py",
      "    Transition(S.TUNING, S.SCALING, Event.SCALE_ALERT,",
      "    Transition(S.TUNING, S.COOLDOWN, Event.SCALE_ALERT,", TUNER),
    M("windows_half_overlap", "slopilot/engine/sim/windows.py",
      "abs(start - w.start_s) >= length_s / 2", "abs(start - w.start_s) > length_s / 2",
      WINDOWS),
    M("image_prefix_slash", "slopilot/operator/policy.py",
      'ref.repository.startswith(stem + "/")',
      "ref.repository.startswith(stem)", OPERATOR),
    M("wildcard_dot", "slopilot/operator/policy.py", "if host.endswith(want_host[1:]):",
      "if host.endswith(want_host[2:]):", OPERATOR),
    M("network_policy_types", "slopilot/operator/render.py", '"policyTypes": ["Ingress"]',
      '"policyTypes": []', OPERATOR),
    M("read_only_root", "slopilot/operator/pod_layout.py", '"readOnlyRootFilesystem": True,',
      '"readOnlyRootFilesystem": False,', OPERATOR),
    M("gpu_max", "slopilot/operator/spec.py", "if not 0 <= gpu <= MAX_GPUS:",
      "if not 0 <= gpu < MAX_GPUS:", OPERATOR),
    M("replicas_max", "slopilot/operator/spec.py", "elif hi > MAX_REPLICAS:",
      "elif hi >= MAX_REPLICAS:", OPERATOR),
)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so the ``finally`` that restores the file runs


def run(m: Mutation) -> bool:
    """True if the tests killed ``m``."""
    path = ROOT / m.path
    source = path.read_text(encoding="utf-8")
    if source.count(m.old) != 1:
        raise SystemExit(f"{m.name}: {m.old!r} occurs {source.count(m.old)} times in "
                         f"{m.path}, not once: update the mutation")
    try:
        path.write_text(source.replace(m.old, m.new), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests],
            cwd=ROOT, capture_output=True, text=True, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        path.write_text(source, encoding="utf-8")
    last = done.stdout.strip().splitlines()[-1:] or ["(no output)"]
    print(f"{'killed' if done.returncode else 'SURVIVED'} {m.name}: {last[0]}", flush=True)
    return done.returncode != 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutation names to run")
    args = parser.parse_args()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "slopilot"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        raise SystemExit("slopilot/ has uncommitted changes: commit or stash them first "
                         "(a mutation's restore rewrites the file)")
    signal.signal(signal.SIGTERM, _stop)
    chosen = [m for m in MUTATIONS if args.only is None or m.name in args.only]
    survivors = [m.name for m in chosen if not run(m)]
    print(f"RESULT mutations={len(chosen)} killed={len(chosen) - len(survivors)} "
          f"survived={len(survivors)} survivors={','.join(survivors) or 'none'}")


if __name__ == "__main__":
    main()
