"""The adapter from engine-loop events to ``EngineMetrics``.

The engine loop reports per-iteration and per-token events to its observers; this one
turns them into the calls ``EngineMetrics`` expects. The scheduler keeps lifetime
counters (preemptions, prefix-cache lookups); the metrics want what happened since the
last step, so the adapter remembers the last values and passes the differences.

It knows nothing about the server or about time sources: the server (wall clock) and the
discrete-event simulator (virtual clock) both attach it.
"""

from __future__ import annotations

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.engine import LLMEngine
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.outputs import SchedulerOutput
from slopilot.engine.request import FinishReason, Request
from slopilot.engine.sim.shape import shape_of
from slopilot.engine.slo import SLOJudge, SLOSpec


class MetricsObserver:
    """A ``StepObserver`` that feeds one ``EngineMetrics``."""

    def __init__(self, metrics: EngineMetrics, *, observe_delivery: bool = True) -> None:
        self.metrics = metrics
        # False: the server observes what only delivery decides itself, as the client sees
        # it: TTFT when a choice's first chunk is written, e2e latency and the finish
        # reason the client was told when its last is, and generated tokens as they are
        # handed out. Stamped here, on the engine thread,
        # they would miss detokenization and the write (e2e came out below TTFT for the
        # same request) and count tokens made after a stop string matched, which the
        # client never gets. The simulator has no delivery: its engine's events are the
        # client's. The server observes TBT too, for the tokens it hands out, as their
        # client sees the gaps (a stream's between chunk writes); the longest decode
        # stall, an engine figure, stays here.
        self.observe_delivery = observe_delivery
        # Per-request verdicts where the engine's events are the client's (the server
        # judges what it delivers itself): by the metrics' SLO, as the summary counts.
        self._judge: tuple[SLOSpec, SLOJudge] | None = None
        self._config: EngineConfig | None = None
        self._recompute = 0
        self._swap = 0
        self._queries = 0
        self._hits = 0
        self._swap_s = 0.0
        # Preemptions counted in vllm:num_preemptions_total so far, of the live requests
        # preempted at least once.
        self._preemptions_counted: dict[str, int] = {}

    def on_step(self, engine: LLMEngine, out: SchedulerOutput, elapsed_s: float,
                now: float) -> None:
        self._record(engine, now, elapsed_s, out)
        self.metrics.on_iteration(shape_of(out), engine.last_step_s, elapsed_s)

    def refresh(self, engine: LLMEngine, now: float) -> None:
        """Update the gauges without an iteration (after aborts, when going idle).

        The engine calls ``on_step`` only when an iteration ran, so without this the
        running/waiting gauges would keep their last busy values while the engine idles.
        """
        self._record(engine, now, 0.0, None)

    def _record(self, engine: LLMEngine, now: float, elapsed_s: float,
                out: SchedulerOutput | None) -> None:
        sched = engine.scheduler
        config = sched.config
        if config is not self._config:
            self._config = config
            self.metrics.set_config(config)
        recompute = sched.num_preemptions[PreemptionMode.RECOMPUTE]
        swap = sched.num_preemptions[PreemptionMode.SWAP]
        queries, hits = sched.prefix_queries, sched.prefix_hits
        self.metrics.on_step(
            now=now, elapsed_s=elapsed_s, num_running=sched.num_running,
            num_waiting=sched.num_waiting, num_swapped=sched.num_swapped,
            kv_usage=sched.kv.usage,
            iteration_tokens=out.vllm_iteration_tokens if out is not None else 0,
            num_preempted_recompute=recompute - self._recompute,
            num_preempted_swap=swap - self._swap,
            swap_s=sched.swap_seconds - self._swap_s,
            prefix_queries=queries - self._queries, prefix_hits=hits - self._hits)
        self._recompute, self._swap = recompute, swap
        self._queries, self._hits = queries, hits
        self._swap_s = sched.swap_seconds

    def _count_preemptions(self, req: Request) -> None:
        # vLLM's scheduler records each preemption on its request; the frontend counts
        # them with that request's next output (IterationStats.update_from_events), and
        # drops them with its state if it ends first (a client gone). Counted where they
        # happen, a window's preemptions read up to a re-prefill earlier than vLLM's.
        rid = req.request_id
        counted = self._preemptions_counted.get(rid, 0)
        if req.num_preemptions > counted:
            self.metrics.count_preemptions(req.num_preemptions - counted)
            self._preemptions_counted[rid] = req.num_preemptions

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        if req.num_preemptions:
            self._count_preemptions(req)
        self.metrics.on_first_token(req.priority, ttft_s if self.observe_delivery else None,
                                    1 if self.observe_delivery else 0,
                                    prompt_tokens=req.num_prompt_tokens)

    def _judged(self) -> SLOJudge | None:
        slo = self.metrics.slo
        if not self.observe_delivery or slo is None:
            return None
        if self._judge is None or self._judge[0] is not slo:
            self._judge = (slo, SLOJudge(slo))
        return self._judge[1]

    def on_token_gap(self, req: Request, gap_s: float, now: float) -> None:
        if req.num_preemptions:
            self._count_preemptions(req)
        if self.observe_delivery:
            self.metrics.on_token_gap(req.priority, gap_s, now)
            if (judge := self._judged()) is not None:
                judge.on_token_gap(req, gap_s)
        else:
            self.metrics.on_decode_gap(req.priority, gap_s, now)

    def on_finished(self, req: Request, now: float) -> None:
        if req.num_preemptions:
            self._preemptions_counted.pop(req.request_id, None)
        # A request aborted before it was ever scheduled spent all its life queued.
        scheduled = req.first_scheduled_time if req.first_scheduled_time is not None else now
        reason = req.finish_reason or FinishReason.ABORT
        # Queue time is the engine's own: from when it took the request (after parsing
        # and tokenizing), so TTFT = front door + queue + prefill + delivery splits up.
        queued = req.queued_time if req.queued_time is not None else req.arrival_time
        # The engine's phases as vLLM splits a request; none for one that made no token.
        first, last = req.first_token_time, req.last_token_time
        prefill_s = decode_s = inference_s = None
        if first is not None and last is not None:
            prefill_s, decode_s, inference_s = first - scheduled, last - first, last - scheduled
        self.metrics.on_finished(
            req.priority, e2e_s=now - req.arrival_time if self.observe_delivery else None,
            queue_s=scheduled - queued,
            prompt_tokens=req.num_prompt_tokens,
            generation_tokens=req.num_output_tokens if self.observe_delivery else None,
            finish_reason=reason.value if self.observe_delivery else None,
            prefill_s=prefill_s, decode_s=decode_s, inference_s=inference_s)
        if self.observe_delivery and first is None and reason is FinishReason.ABORT:
            # Its client got no first token (the server counts what it delivers itself);
            # one that left within its TTFT target missed nothing.
            slo = self.metrics.slo
            within = slo is not None and slo.class_slo(req.priority).left_within_ttft(
                now - req.arrival_time)
            self.metrics.count_abandoned(req.priority, within_target=within)
        if (judge := self._judged()) is not None and (met := judge.finished(req)) is not None:
            self.metrics.observe_verdict(req.priority, judge.class_slo(req.priority),
                                         met=met, tokens=req.num_output_tokens)
