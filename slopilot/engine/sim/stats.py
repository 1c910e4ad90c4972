"""Raw per-token statistics of a simulated run, and the summary DESIGN.md §8 specifies.

Percentiles here are exact (computed from every sample), unlike the bucketed
Prometheus histograms; the simulator is where the tuner gets its numbers.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Priority, Request

if TYPE_CHECKING:
    from slopilot.engine.engine import LLMEngine
    from slopilot.engine.slo import SLOSpec

_CLASSES = tuple(Priority)


@dataclass
class _ClassStats:
    ttft: array = field(default_factory=lambda: array("d"))
    tbt: array = field(default_factory=lambda: array("d"))
    tokens: int = 0
    good_tokens: int = 0
    finished: int = 0
    met_slo: int = 0
    max_stall: float = 0.0


class SimStats:
    """An engine observer that records every token gap; ``summary()`` reduces them."""

    def __init__(self, slo: SLOSpec, end_time: float) -> None:
        self.slo = slo
        self.end_time = end_time
        self.classes = {p: _ClassStats() for p in _CLASSES}
        # Per live request with any: gaps above its class TBT SLO (rare, so kept sparse).
        self._over: dict[str, int] = {}
        self._tbt_slo = {p: _seconds(slo.class_slo(p).tbt_p99_ms) for p in _CLASSES}
        self._ttft_slo = {p: _seconds(slo.class_slo(p).ttft_p99_ms) for p in _CLASSES}
        self.steps = 0
        self.busy_s = 0.0
        self.preempt_recompute = 0
        self.preempt_swap = 0
        self.kv_usage_sum = 0.0
        self.kv_usage_max = 0.0
        self.batched_tokens = 0

    # --------------------------------------------------------------- observer
    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        if now > self.end_time:
            return
        self.steps += 1
        self.busy_s += elapsed_s
        self.preempt_recompute += out.num_preempted_recompute
        self.preempt_swap += out.num_preempted_swap
        self.batched_tokens += out.num_batched_tokens
        usage = engine.scheduler.kv.usage
        self.kv_usage_sum += usage
        if usage > self.kv_usage_max:
            self.kv_usage_max = usage

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        if now > self.end_time:
            return
        c = self.classes[req.priority]
        c.ttft.append(ttft_s)
        c.tokens += 1

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        slo = self._tbt_slo[req.priority]
        if slo is not None and gap_s > slo:
            rid = req.request_id
            self._over[rid] = self._over.get(rid, 0) + 1
        if now > self.end_time:
            return
        c = self.classes[req.priority]
        c.tbt.append(gap_s)
        c.tokens += 1
        if gap_s > c.max_stall:
            c.max_stall = gap_s

    def on_finished(self, req: Request, now: float) -> None:
        over = self._over.pop(req.request_id, 0)
        if now > self.end_time or req.first_token_time is None:
            return
        c = self.classes[req.priority]
        c.finished += 1
        ttft_slo = self._ttft_slo[req.priority]
        ttft_ok = ttft_slo is None or req.first_token_time - req.arrival_time <= ttft_slo
        # The request's own P99 gap is within the SLO when at most 1% of gaps exceed it.
        tbt_ok = over <= 0.01 * (req.num_output_tokens - 1)
        if ttft_ok and tbt_ok:
            c.met_slo += 1
            c.good_tokens += req.num_output_tokens

    # --------------------------------------------------------------- summary
    def summary(self, duration_s: float) -> dict[str, Any]:
        minutes = duration_s / 60.0
        per_class = {p.label: _class_summary(self.classes[p], duration_s) for p in _CLASSES}
        overall = _class_summary(_merge(self.classes.values()), duration_s)
        preemptions = self.preempt_recompute + self.preempt_swap
        overall.update({
            "duration_s": duration_s,
            "preemptions_per_min": preemptions / minutes if minutes else 0.0,
            "preemptions_per_min_recompute": self.preempt_recompute / minutes if minutes
            else 0.0,
            "preemptions_per_min_swap": self.preempt_swap / minutes if minutes else 0.0,
            "iterations": self.steps,
            "busy_ratio": self.busy_s / duration_s if duration_s else 0.0,
            "mean_batch_tokens": self.batched_tokens / self.steps if self.steps else 0.0,
            "kv_usage_mean": self.kv_usage_sum / self.steps if self.steps else 0.0,
            "kv_usage_max": self.kv_usage_max,
            "classes": per_class,
        })
        # Preemptions are counted engine-wide, so each class reports the shared rate.
        for summary in per_class.values():
            summary["preemptions_per_min"] = overall["preemptions_per_min"]
        return overall


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _merge(parts: Any) -> _ClassStats:
    merged = _ClassStats()
    for c in parts:
        merged.ttft.extend(c.ttft)
        merged.tbt.extend(c.tbt)
        merged.tokens += c.tokens
        merged.good_tokens += c.good_tokens
        merged.finished += c.finished
        merged.met_slo += c.met_slo
        merged.max_stall = max(merged.max_stall, c.max_stall)
    return merged


def _pct(values: array, q: float) -> float:
    if not values:
        return 0.0
    return float(np.percentile(np.frombuffer(values, dtype=np.float64), q)) * 1000.0


def _class_summary(c: _ClassStats, duration_s: float) -> dict[str, Any]:
    ttft = np.frombuffer(c.ttft, dtype=np.float64) if c.ttft else None
    return {
        "requests_finished": c.finished,
        "slo_attainment": c.met_slo / c.finished if c.finished else None,
        "ttft_mean_ms": float(ttft.mean()) * 1000.0 if ttft is not None else 0.0,
        "ttft_p50_ms": _pct(c.ttft, 50),
        "ttft_p90_ms": _pct(c.ttft, 90),
        "ttft_p99_ms": _pct(c.ttft, 99),
        "tbt_p50_ms": _pct(c.tbt, 50),
        "tbt_p99_ms": _pct(c.tbt, 99),
        "max_stall_ms": c.max_stall * 1000.0,
        "throughput_tok_s": c.tokens / duration_s if duration_s else 0.0,
        "goodput_tok_s": c.good_tokens / duration_s if duration_s else 0.0,
    }
