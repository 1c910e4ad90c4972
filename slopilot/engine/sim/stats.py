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

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import Priority, Request
from slopilot.engine.slo import SLOJudge
from slopilot.engine.window_summary import (
    ClassFigures,
    EngineStats,
    RequestAccounting,
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
    good_all_tokens: int = 0
    arrived: int = 0
    rejected: int = 0
    refused: int = 0
    """Of ``rejected``, those turned away for load (a full waiting queue), not for a
    prompt that can never fit: their TTFT is a first token never given."""
    unfinished: int = 0
    censored: int = 0
    offered_tokens: int = 0


class SimStats:
    """An engine observer that records every token gap; ``summary()`` reduces them.

    It counts the requests arriving in ``[start_time, end_time)`` (the measured window;
    earlier arrivals are warm-up, later ones load the engine but are not counted) and
    follows them until ``horizon`` (the run's end, ``end_time`` by default). Engine-wide
    figures (busy, preemptions, KV usage) count the iterations that end in the window.
    ``on_arrival``/``on_rejected``/``on_displaced`` come from the simulator; ``close`` at
    the run's end censors the counted requests still unfinished.
    """

    def __init__(self, slo: SLOSpec, end_time: float, *, start_time: float = 0.0,
                 horizon: float | None = None) -> None:
        self.slo = slo
        self.start_time = start_time
        self.end_time = end_time
        self.horizon = end_time if horizon is None else horizon
        self.classes = {p: _ClassStats() for p in _CLASSES}
        self._judge = SLOJudge(slo)
        self._open: dict[str, Request] = {}
        self.steps = 0
        self.busy_s: dict[int, float] = {}  # per engine (id), for the per-replica ratio
        self.preempt_recompute = 0
        self.preempt_swap = 0
        self.kv_usage_sum = 0.0
        self.kv_usage_max = 0.0
        self.batched_tokens = 0

    def _counted(self, req: Request, now: float) -> bool:
        return self.start_time <= req.arrival_time < self.end_time and now <= self.horizon

    # --------------------------------------------------------------- arrivals
    def on_arrival(self, req: Request) -> None:
        """An admitted request (the simulator calls this after ``add_request``)."""
        if self.start_time <= req.arrival_time < self.end_time:
            c = self.classes[req.priority]
            c.arrived += 1
            c.offered_tokens += req.sampling.max_tokens
            self._open[req.request_id] = req

    def on_rejected(self, arrival_time: float, priority: Priority, max_tokens: int, *,
                    for_load: bool = False) -> None:
        """A request refused at arrival (prompt too long, or ``for_load``: the waiting
        queue was full); told by its figures, not a ``Request``: one too long to hold is
        never built."""
        if self.start_time <= arrival_time < self.end_time:
            c = self.classes[priority]
            c.arrived += 1
            c.rejected += 1
            c.refused += for_load
            c.offered_tokens += max_tokens

    def on_displaced(self, req: Request) -> None:
        """An admitted request that a full queue displaced before it started, for a more
        urgent one (``queue_room.py``): refused for load after all, its arrival and
        offered tokens counted already (``on_arrival``)."""
        if self._open.pop(req.request_id, None) is not None:
            c = self.classes[req.priority]
            c.rejected += 1
            c.refused += 1

    def all_judged(self) -> bool:
        """Every counted request admitted so far has finished (or been rejected)."""
        return not self._open

    # --------------------------------------------------------------- observer
    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        key = id(engine)
        self.busy_s.setdefault(key, 0.0)
        if not self.start_time < now <= self.end_time:
            return
        self.steps += 1
        self.busy_s[key] += elapsed_s
        self.preempt_recompute += out.num_preempted_recompute
        self.preempt_swap += out.num_preempted_swap
        self.batched_tokens += out.num_batched_tokens
        usage = engine.scheduler.kv.usage
        self.kv_usage_sum += usage
        if usage > self.kv_usage_max:
            self.kv_usage_max = usage

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        if not self._counted(req, now):
            return
        c = self.classes[req.priority]
        c.ttft.append(ttft_s)
        c.tokens += 1

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        # One engine output of a request, one token: the twin models no speculative
        # decoding and no server loop that merges outputs, so each gap here is also one
        # chunk's, as the live series count them (``ClientGaps``, one a chunk), and each
        # brings one token (``tests/engine/sim/test_stats.py`` holds both).
        self._judge.on_token_gap(req, gap_s)
        if not self._counted(req, now):
            return
        c = self.classes[req.priority]
        c.tbt.append(gap_s)
        c.tokens += 1
        if gap_s > c.max_stall:
            c.max_stall = gap_s

    def on_finished(self, req: Request, now: float) -> None:
        met = self._judge.finished(req)
        if not self._counted(req, now):
            return
        self._open.pop(req.request_id, None)
        c = self.classes[req.priority]
        if met is None:  # ended by the engine before a first token: it can never fit
            c.rejected += 1
            return
        c.finished += 1
        if met:
            c.met_slo += 1
            c.good_tokens += req.num_output_tokens
            c.good_all_tokens += req.num_prompt_tokens + req.num_output_tokens

    def close(self) -> None:
        """The run ended at ``horizon``: censor what the counted requests still wait for.
        A censored TTFT is the wait so far, a lower bound: one past its class's TTFT
        target ranks as a miss, as the live rules read a request still waiting past it
        at a window's end (``engine/awaiting.py``)."""
        for req in self._open.values():
            c = self.classes[req.priority]
            c.unfinished += 1
            first = req.first_token_time
            if first is None or first > self.horizon:
                c.ttft.append(self.horizon - req.arrival_time)
                c.censored += 1
        self._open.clear()

    # --------------------------------------------------------------- summary
    def summary(self, duration_s: float | None = None, run: RunInfo | None = None,
                replicas: int | None = None) -> WindowSummary:
        """The window's figures (per second of ``duration_s``, the window's length by
        default); ``run`` and ``replicas`` are what ``simulate`` adds."""
        if duration_s is None:
            duration_s = self.end_time - self.start_time
        minutes = duration_s / 60.0

        def per_min(count: int) -> float:
            return count / minutes if minutes else 0.0

        busy = list(self.busy_s.values())
        busy += [0.0] * max(0, (replicas or len(busy) or 1) - len(busy))
        steps = self.steps
        return WindowSummary(
            duration_s=duration_s,
            preemptions_per_min=per_min(self.preempt_recompute + self.preempt_swap),
            overall=_figures(_merge(self.classes.values()), duration_s),
            classes={p: _figures(self.classes[p], duration_s) for p in _CLASSES},
            replicas=replicas,
            busy_ratio=sum(busy) / len(busy) / duration_s if duration_s else 0.0,
            busy_ratio_max=max(busy) / duration_s if duration_s else 0.0,
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
        merged.good_all_tokens += c.good_all_tokens
        merged.arrived += c.arrived
        merged.rejected += c.rejected
        merged.refused += c.refused
        merged.unfinished += c.unfinished
        merged.censored += c.censored
        merged.offered_tokens += c.offered_tokens
    return merged


REFUSED_TTFT_S = TOKEN_LATENCY_BUCKETS[-1]
"""A TTFT percentile that falls among the requests turned away for load: the highest
finite edge of the engine's TTFT histogram, which is what ``histogram_quantile`` reads for
a quantile in the +Inf bucket, where the live rules count them (``rules.py``)."""


def ttft_percentile_ms(seconds: Sequence[float] | array | np.ndarray, refused: int,
                       q: float) -> float | None:
    """The ``q``-th percentile of first-token times in ms, with ``refused`` requests never
    served ranked past every served one (``REFUSED_TTFT_S`` where it falls among them);
    None with neither."""
    n = len(seconds)
    if not refused:
        return percentile_ms(seconds, q)
    # Among them exactly where histogram_quantile puts it (the live rules): more than
    # 1 - q of all never served. numpy's rank in the union crosses into them earlier (1 of
    # 100 at the P99), and the twin judged a miss where the live deployment held.
    if q / 100.0 * (n + refused) > n:
        return REFUSED_TTFT_S * 1000.0
    rank = min(q / 100.0 * (n + refused - 1), n - 1.0)  # numpy's linear rank in the union
    return percentile_ms(seconds, 100.0 * rank / (n - 1) if n > 1 else q)


def measured_pct(measured: int, refused: int) -> float | None:
    """The percent of the TTFT ranking that ``measured`` TTFTs make beside ``refused``
    requests never served (``SampleStats.ttft_measured_pct``); None with neither. A
    percentile above it is ``ttft_percentile_ms``'s ``REFUSED_TTFT_S``."""
    ranked = measured + refused
    return 100.0 * measured / ranked if ranked else None


def to_ms(seconds: float) -> float:
    """Seconds in ms, as every P99 in a summary is turned: the TBT sweep's limit is found
    through it too (``window_stats.tbt_limit_s``), so the two round alike."""
    return seconds * 1000.0


def percentile_ms(seconds: Sequence[float] | array | np.ndarray, q: float) -> float | None:
    """The exact ``q``-th percentile of samples in seconds, in ms; None without samples."""
    if not len(seconds):
        return None
    values = np.frombuffer(seconds, dtype=np.float64) if isinstance(seconds, array) \
        else np.asarray(seconds, dtype=np.float64)
    return to_ms(float(np.percentile(values, q)))


def _figures(c: _ClassStats, duration_s: float) -> ClassFigures:
    ttft = np.frombuffer(c.ttft, dtype=np.float64) if c.ttft else None

    def rate(count: int) -> float:
        return count / duration_s if duration_s else 0.0

    return ClassFigures(
        requests_finished=c.finished,
        throughput_tok_s=c.tokens / duration_s if duration_s else 0.0,
        goodput_tok_s=c.good_tokens / duration_s if duration_s else 0.0,
        ttft_p99_ms=ttft_percentile_ms(c.ttft, c.refused, 99),
        tbt_p99_ms=percentile_ms(c.tbt, 99),
        # Of the requests judged, as the exported verdicts count them: one turned away
        # for load missed (it was never served).
        slo_attainment=(c.met_slo / (c.finished + c.refused)
                        if c.finished + c.refused else None),
        requests_refused=c.refused, ttft_samples=len(c.ttft) + c.refused,
        requests_awaiting=c.censored,
        samples=SampleStats(
            ttft_mean_ms=float(ttft.mean()) * 1000.0 if ttft is not None else None,
            ttft_p50_ms=ttft_percentile_ms(c.ttft, c.refused, 50),
            ttft_p90_ms=ttft_percentile_ms(c.ttft, c.refused, 90),
            tbt_p50_ms=percentile_ms(c.tbt, 50), max_stall_ms=c.max_stall * 1000.0,
            ttft_measured_pct=measured_pct(len(c.ttft), c.refused)),
        accounting=RequestAccounting(
            requests_arrived=c.arrived, requests_rejected=c.rejected,
            requests_unfinished=c.unfinished, ttft_censored=c.censored,
            offered_tok_s=rate(c.offered_tokens), goodput_all_tok_s=rate(c.good_all_tokens)))
