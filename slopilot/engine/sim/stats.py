"""Raw per-token statistics of a simulated run, reduced to its ``WindowSummary``.

Percentiles here are exact (computed from every sample), unlike the bucketed
Prometheus histograms; the simulator is where the tuner gets its numbers. The keys of
``slopilot simulate --json`` are ``WindowSummary.to_dict``'s (``engine/window_summary.py``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Priority, Request
from slopilot.engine.window_summary import (
    ClassFigures,
    EngineStats,
    RunInfo,
    SampleStats,
    WindowSummary,
)

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


class SLOJudge:
    """Whether each finished request met its class's SLO (``ClassSLO.met``, the one rule).

    An engine observer's helper: it counts, per live request, the token gaps above the
    class's TBT target (rare, so kept sparse) until the request finishes.
    """

    def __init__(self, slo: SLOSpec) -> None:
        self._classes = slo.classes()
        self._tbt_s = {p: None if c.tbt_p99_ms is None else c.tbt_p99_ms / 1000.0
                       for p, c in self._classes.items()}
        self._over: dict[str, int] = {}

    def on_token_gap(self, req: Request, gap_s: float) -> None:
        limit = self._tbt_s[req.priority]
        if limit is not None and gap_s > limit:
            self._over[req.request_id] = self._over.get(req.request_id, 0) + 1

    def finished(self, req: Request) -> bool | None:
        """Met or not; None for a request that ended without a token (nothing to judge)."""
        over = self._over.pop(req.request_id, 0)
        if req.first_token_time is None:
            return None
        return self._classes[req.priority].met(req.first_token_time - req.arrival_time,
                                               req.num_output_tokens - 1, over)


class SimStats:
    """An engine observer that records every token gap; ``summary()`` reduces them."""

    def __init__(self, slo: SLOSpec, end_time: float) -> None:
        self.slo = slo
        self.end_time = end_time
        self.classes = {p: _ClassStats() for p in _CLASSES}
        self._judge = SLOJudge(slo)
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
        self._judge.on_token_gap(req, gap_s)
        if now > self.end_time:
            return
        c = self.classes[req.priority]
        c.tbt.append(gap_s)
        c.tokens += 1
        if gap_s > c.max_stall:
            c.max_stall = gap_s

    def on_finished(self, req: Request, now: float) -> None:
        met = self._judge.finished(req)
        if now > self.end_time or met is None:
            return
        c = self.classes[req.priority]
        c.finished += 1
        if met:
            c.met_slo += 1
            c.good_tokens += req.num_output_tokens

    # --------------------------------------------------------------- summary
    def summary(self, duration_s: float, run: RunInfo | None = None,
                replicas: int | None = None) -> WindowSummary:
        """The run's figures: ``run`` and ``replicas`` are what ``simulate`` adds."""
        minutes = duration_s / 60.0

        def per_min(count: int) -> float:
            return count / minutes if minutes else 0.0

        steps = self.steps
        return WindowSummary(
            duration_s=duration_s,
            preemptions_per_min=per_min(self.preempt_recompute + self.preempt_swap),
            overall=_figures(_merge(self.classes.values()), duration_s),
            classes={p: _figures(self.classes[p], duration_s) for p in _CLASSES},
            replicas=replicas, busy_ratio=self.busy_s / duration_s if duration_s else 0.0,
            engine=EngineStats(
                iterations=steps,
                mean_batch_tokens=self.batched_tokens / steps if steps else 0.0,
                kv_usage_mean=self.kv_usage_sum / steps if steps else 0.0,
                kv_usage_max=self.kv_usage_max,
                preemptions_per_min_recompute=per_min(self.preempt_recompute),
                preemptions_per_min_swap=per_min(self.preempt_swap)),
            run=run)


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


def percentile_ms(seconds: Sequence[float] | array | np.ndarray, q: float) -> float | None:
    """The exact ``q``-th percentile of samples in seconds, in ms; None without samples."""
    if not len(seconds):
        return None
    values = np.frombuffer(seconds, dtype=np.float64) if isinstance(seconds, array) \
        else np.asarray(seconds, dtype=np.float64)
    return float(np.percentile(values, q)) * 1000.0


def _figures(c: _ClassStats, duration_s: float) -> ClassFigures:
    ttft = np.frombuffer(c.ttft, dtype=np.float64) if c.ttft else None
    return ClassFigures(
        requests_finished=c.finished,
        throughput_tok_s=c.tokens / duration_s if duration_s else 0.0,
        goodput_tok_s=c.good_tokens / duration_s if duration_s else 0.0,
        ttft_p99_ms=percentile_ms(c.ttft, 99), tbt_p99_ms=percentile_ms(c.tbt, 99),
        slo_attainment=c.met_slo / c.finished if c.finished else None,
        samples=SampleStats(
            ttft_mean_ms=float(ttft.mean()) * 1000.0 if ttft is not None else None,
            ttft_p50_ms=percentile_ms(c.ttft, 50), ttft_p90_ms=percentile_ms(c.ttft, 90),
            tbt_p50_ms=percentile_ms(c.tbt, 50), max_stall_ms=c.max_stall * 1000.0))
