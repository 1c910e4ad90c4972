"""The engine's Prometheus metrics, named like vLLM's so one set of rules serves both.

The engine loop (and the simulator, millions of times) feeds ``EngineMetrics`` through a
few ``on_*`` calls that only touch plain lists and numbers; the prometheus_client
objects are built on scrape by ``collect``. ``render`` serves the classic text format:
the OpenMetrics encoder would turn the ``:`` in ``vllm:...`` into ``_``.

The names of every series exported are in ``metric_names.py``; the histograms read as
Prometheus reads them, in ``histogram_quantiles.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slopilot import __version__
from slopilot.engine.alert_factors import DEFAULT_FACTORS, AlertFactors
from slopilot.engine.awaiting import AwaitingFirstToken
from slopilot.engine.config import EngineConfig
from slopilot.engine.iteration_metrics import IterationMetrics
from slopilot.engine.latency_buckets import (
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    token_latency_buckets,
)
from slopilot.engine.metric_names import (
    ABANDONED,
    ARRIVED,
    AWAITING,
    REFUSED,
    RETRIES,
    SEND_TIMEOUTS,
)
from slopilot.engine.metric_window import HistogramRecorder, SlidingMax, SlidingSum
from slopilot.engine.metrics_text import (
    HistogramText,
    Part,
    TextRegistry,
    families,
    parts_text,
    render,
)
from slopilot.engine.request import Priority
from slopilot.engine.sim.shape import IterationShape
from slopilot.engine.slo import WITHIN_TTFT_TARGET, ClassSLO, SLOSpec
from slopilot.engine.verdicts import Verdicts

TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2 ** i) for i in range(17))  # 1 .. 65536
# vLLM's FinishReasons (vllm/v1/engine FinishReason), each exported from the start: the
# engine ends a request with the first three only, and a rule on the others reads 0 as
# on vLLM, not no data.
VLLM_FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
CLASS_LABELS: tuple[str, ...] = tuple(p.label for p in Priority)


def _label_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(getattr(value, "value", value))


class EngineMetrics:
    """Counters, gauges and histograms of one engine, exported on scrape."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 info: Mapping[str, str] | None = None, busy_window_s: float = 30.0,
                 stall_window_s: float = 60.0) -> None:
        if not model_name:
            raise ValueError("model_name is empty; pass the served model's name")
        for key in info or {}:
            if key in ("model_name", "version") or not _LABEL_NAME.fullmatch(key):
                raise ValueError(f"info label {key!r}: use a Prometheus label name (letters, "
                                 "digits, _) other than model_name and version")
        self.model_name = model_name
        self.registry = registry if registry is not None else TextRegistry()
        self._clock = clock
        self._info = {"version": __version__, **(info or {})}
        self._config: dict[str, str] = {}
        self._knobs: dict[str, float] = {}

        def per_class(edges: tuple[float, ...]) -> list[HistogramRecorder]:
            # Indexed by Priority (an IntEnum 0..2): a list index is the cheapest lookup.
            return [HistogramRecorder(edges) for _ in Priority]

        # The two whose quantiles are read: dense edges (latency_buckets).
        self._ttft = per_class(TOKEN_LATENCY_BUCKETS)
        self._itl = per_class(TOKEN_LATENCY_BUCKETS)
        self._e2e = per_class(REQUEST_LATENCY_BUCKETS)
        self._queue = per_class(REQUEST_LATENCY_BUCKETS)
        self._prefill = per_class(REQUEST_LATENCY_BUCKETS)
        self._decode = per_class(REQUEST_LATENCY_BUCKETS)
        self._inference = per_class(REQUEST_LATENCY_BUCKETS)
        self._req_prompt = per_class(TOKEN_BUCKETS)
        self._req_generation = per_class(TOKEN_BUCKETS)
        self._req_max_generation = per_class(TOKEN_BUCKETS)
        self._iteration = HistogramRecorder(TOKEN_BUCKETS)
        self._stall = [SlidingMax(stall_window_s) for _ in Priority]
        self._busy = SlidingSum(busy_window_s)
        self.iterations = IterationMetrics()
        self._histograms = self._histogram_texts()

        self.num_running = 0
        self.num_waiting = 0
        self.num_swapped = 0
        self.kv_usage = 0.0
        self.preempted_recompute = 0
        self.preempted_swap = 0
        self.preemptions_delivered = 0
        self.swap_seconds = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        # Every reason at 0 from the start, as vLLM exports them: a counter born at 1
        # never shows its first request to rate() or increase().
        self._success: dict[str, int] = {r: 0 for r in VLLM_FINISH_REASONS}
        self._verdicts = Verdicts()
        self._refused = [0 for _ in Priority]
        self._arrived = [0 for _ in Priority]
        self._abandoned = {(p, within): 0 for p in Priority for within in (False, True)}
        self.awaiting = AwaitingFirstToken()
        """The choices let in and given no first token yet (``metric_names.AWAITING``):
        the server's event loop enters and settles them (``server/responses.py``)."""
        self._retries = {(p, refused): 0 for p in Priority for refused in (True, False)}
        self.send_timeouts = 0
        self.registry.register(self)

    def _histogram_texts(self) -> list[HistogramText]:
        """Every histogram family of this engine but the iterations', as its text."""
        by_class = ["model_name", "priority_class"]
        texts = [
            HistogramText(name, doc, by_class,
                          [([self.model_name, p.label], recorders[p]) for p in Priority])
            for name, doc, recorders in (
                ("vllm:time_to_first_token_seconds",
                 "Time to first token: request arrival to its first output.", self._ttft),
                ("vllm:inter_token_latency_seconds", "Time between tokens (TBT).", self._itl),
                ("vllm:e2e_request_latency_seconds",
                 "End-to-end: request arrival to its last output.", self._e2e),
                ("vllm:request_queue_time_seconds",
                 "Engine queue: taken by the engine to first scheduled.", self._queue),
                ("vllm:request_prefill_time_seconds", "First scheduled to first token.",
                 self._prefill),
                ("vllm:request_decode_time_seconds", "First token to last token.",
                 self._decode),
                ("vllm:request_inference_time_seconds", "First scheduled to last token.",
                 self._inference),
                ("vllm:request_prompt_tokens", "Prompt length of finished requests.",
                 self._req_prompt),
                ("vllm:request_generation_tokens", "Output length of finished requests.",
                 self._req_generation),
                ("vllm:request_max_num_generation_tokens", "Longest output of the "
                 "n choices of one prompt, once all ended.",
                 self._req_max_generation))]
        texts.append(HistogramText("vllm:iteration_tokens_total", "Tokens per iteration "
                                   "as vLLM counts them: those it made, and each prefill's "
                                   "prompt less its cache hit in the iteration it ends.",
                                   ["model_name"], [([self.model_name], self._iteration)]))
        return texts

    # -- fed by the engine loop ------------------------------------------------------

    def set_config(self, config: EngineConfig) -> None:
        values = config.to_dict()
        self._config = {k: _label_value(v) for k, v in sorted(values.items())}
        self._knobs = {k: float(v) for k, v in values.items()
                       if isinstance(v, (int, float))}
        self._knobs["effective_budget"] = float(config.effective_budget)

    def set_slo(self, slo: SLOSpec | None) -> None:
        """The objectives requests are judged by from now on (``Verdicts.set_slo``)."""
        self._verdicts.set_slo(slo)

    def export_slo_edges(self, slo: SLOSpec | None,
                         factors: AlertFactors = DEFAULT_FACTORS) -> None:
        """Give the TTFT and token-gap histograms ``slo``'s thresholds at ``factors``
        (the deployment's ``spec.alerts``) as edges (``latency_buckets.slo_edges``), so a
        P99 just over a deployment's own target, or over an alert's multiple of it,
        reads over it. Before the first observation only (``slopilot serve`` at its
        start): a bucket already counted cannot be split, and an SLO that arrives later
        (``PUT /admin/slo``) judges requests without moving the edges; the rules read
        its thresholds judged on this process (docs/operations.md). RuntimeError after."""
        if any(r.done for r in (*self._ttft, *self._itl)):
            raise RuntimeError("export_slo_edges after the first TTFT or token gap was "
                               "observed: give the SLO's edges before serving")
        self._ttft = [HistogramRecorder(token_latency_buckets(slo, ttft=True,
                                                              factors=factors))
                      for _ in Priority]
        self._itl = [HistogramRecorder(token_latency_buckets(slo, ttft=False,
                                                             factors=factors))
                     for _ in Priority]
        self._histograms = self._histogram_texts()

    @property
    def slo(self) -> SLOSpec | None:
        return self._verdicts.slo

    def observe_verdict(self, priority: Priority, slo: ClassSLO, *, met: bool,
                        tokens: int) -> None:
        """One finished request's verdict against ``slo`` (``ClassSLO.met``), with the
        output tokens the client got. Called on one thread only: the server's event loop
        (as delivered) or, in the simulator, the engine's."""
        self._verdicts.observe(priority, slo, met=met, tokens=tokens)

    def count_refused(self, priority: Priority, slo: SLOSpec | None, *,
                      retry: bool = False) -> None:
        """One request turned away for load (the waiting queue was full: at the door, or
        displaced from it before it started by a more urgent class; or refused at the
        connection cap, ``server/cap_refusals.py``), judged by its
        class's objectives in ``slo`` (the SLO at its arrival; None: none known): it
        missed them, with no token to count. A ``retry`` (its client says it retries one
        turned away already) is counted apart and not judged again: its client's call
        was counted, and missed, at its first try. Called on the server's event loop
        (the simulator's engine, in the twin) only."""
        if retry:
            self._retries[priority, True] += 1
            return
        self._refused[priority] += 1
        if slo is not None:
            self.observe_verdict(priority, slo.class_slo(priority), met=False, tokens=0)

    def count_arrived(self, priority: Priority) -> None:
        """One request (a choice) offered to the engine, a first try: let in, turned
        away at the door for load, or refused at the connection cap, before the engine
        (``metric_names.ARRIVED``). Event loop only."""
        self._arrived[priority] += 1

    def arrived(self) -> dict[Priority, int]:
        """Requests offered to the engine so far, by class (first tries)."""
        return {p: self._arrived[p] for p in Priority}

    def refused(self) -> dict[Priority, int]:
        """Requests turned away for load so far, by class (first tries)."""
        return {p: self._refused[p] for p in Priority}

    def count_abandoned(self, priority: Priority, *, within_target: bool = False) -> None:
        """A choice that ended before a first token reached its client (the client
        left, a drain aborted it, its answer failed): never observed in the TTFT
        histogram. ``within_target``: it ended within its class's TTFT target
        (``ClassSLO.left_within_ttft``), so it missed nothing; else the rules read it
        beside the histogram as a first token never given (``metric_names.ABANDONED``).
        Called on one thread only, as ``observe_ttft``: the server's event loop, or the
        simulator's engine."""
        self._abandoned[priority, within_target] += 1

    def abandoned(self, *, within_target: bool | None = None) -> dict[Priority, int]:
        """Choices ended before a first token reached their client so far, by class:
        those ended within the TTFT target, those not, or (None) all."""
        return {p: sum(n for (q, within), n in self._abandoned.items()
                       if q is p and within_target in (None, within)) for p in Priority}

    def count_retry_admitted(self, priority: Priority) -> None:
        """A retry was let in: served, judged and counted as any request (its call's
        first try may have failed in a way nothing counted: a drain's 503, a lost
        connection), and counted here too. Event loop only."""
        self._retries[priority, False] += 1

    def count_send_timeout(self) -> None:
        """A connection dropped: its client took no byte of its answer for the send
        deadline (``http_deadlines``). Event loop only."""
        self.send_timeouts += 1

    def retries(self, *, refused: bool) -> dict[Priority, int]:
        """Retries so far, by class: those turned away (``refused``), or those let in."""
        return {p: self._retries[p, refused] for p in Priority}

    def verdicts(self) -> dict[tuple[Priority, str, bool], tuple[int, int]]:
        """(class, objectives, met) -> (requests, output tokens) counted so far."""
        return self._verdicts.counts()

    def on_step(self, *, now: float, elapsed_s: float, num_running: int, num_waiting: int,
                num_swapped: int, kv_usage: float, iteration_tokens: int,
                num_preempted_recompute: int, num_preempted_swap: int, swap_s: float,
                prefix_queries: int, prefix_hits: int) -> None:
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.num_swapped = num_swapped
        self.kv_usage = kv_usage
        self.preempted_recompute += num_preempted_recompute
        self.preempted_swap += num_preempted_swap
        self.swap_seconds += swap_s
        self.prefix_queries += prefix_queries
        self.prefix_hits += prefix_hits
        # ``SchedulerOutput.vllm_iteration_tokens``; none where vLLM's engine core sends
        # no output (every row a prefill chunk that samples nothing).
        if iteration_tokens > 0:
            self._iteration.observe(iteration_tokens)
        self._busy.add(elapsed_s, now)

    def count_preemptions(self, n: int) -> None:
        """``n`` preemptions of one request, counted as vLLM counts them: when that
        request next makes a token (``MetricsObserver``; engine thread)."""
        self.preemptions_delivered += n

    def on_iteration(self, shape: IterationShape, step_s: float, executor_s: float) -> None:
        """One iteration's shape with its step and executor times (the twin's check)."""
        self.iterations.observe(shape, step_s, executor_s)

    def on_first_token(self, priority: Priority, ttft_s: float | None, tokens: int = 1, *,
                       prompt_tokens: int = 0) -> None:
        """A request's first token. ``ttft_s`` None: the caller observes TTFT itself
        (the server, when the first chunk is written; see ``observe_ttft``); ``tokens``
        0: it counts delivered tokens itself (``count_delivered``).

        ``prompt_tokens``, the request's prompt, counts here, where its prefill is done,
        as vLLM counts it (once: a prefill recomputed after a preemption is not counted
        again). Counted at the finish, a window's prompts were those of the requests
        that ended in it: right after a shift in prompt lengths, the old ones.
        """
        self.prompt_tokens += prompt_tokens
        if ttft_s is not None:
            self._ttft[priority].observe(ttft_s)
        if tokens:  # not even "+= 0": the server's loop thread owns the count then
            self.generation_tokens += tokens

    def observe_ttft(self, priority: Priority, ttft_s: float) -> None:
        """TTFT as the client sees it: request arrival to its first chunk written.

        Called on one thread only (the server's event loop); the engine thread then
        leaves TTFT alone, so the recorder is never written from two threads.
        """
        self._ttft[priority].observe(ttft_s)

    def observe_delivered(self, priority: Priority, e2e_s: float,
                          generation_tokens: int, finish_reason: str) -> None:
        """End-to-end latency as the client sees it: request arrival to its last chunk
        written, so it holds detokenization and delivery and is never below TTFT; the
        output length the client got (its usage.completion_tokens); and the finish
        reason it was told (a stop string can match in the token that also reached
        max_tokens: the engine finished on length, the client got stop, as in vLLM).

        Called on the server's event loop only, as ``observe_ttft`` is; the engine thread
        then leaves both alone. One call per engine request, aborted ones included: the
        tuner counts finished requests by e2e's ``_count``.
        """
        self._e2e[priority].observe(e2e_s)
        self._req_generation[priority].observe(generation_tokens)
        self._success[finish_reason] = self._success.get(finish_reason, 0) + 1

    def count_delivered(self, tokens: int) -> None:
        """Generated tokens handed to the client (the server's loop, as they reach it:
        each chunk written, or the whole body sent).

        As in vLLM, whose frontend drops what the engine made for a request it already
        stopped: after a stop string matches, the engine runs on until the abort lands
        between iterations, and those tokens never reach the client or its usage.
        """
        self.generation_tokens += tokens

    def on_token_gap(self, priority: Priority, gap_s: float, now: float) -> None:
        """A token after a request's first, where the engine's events are the client's
        (the simulator): its gap, the decode stall and the token count at once."""
        self.observe_token_gap(priority, gap_s)
        self.on_decode_gap(priority, gap_s, now)
        self.generation_tokens += 1

    def on_decode_gap(self, priority: Priority, gap_s: float, now: float) -> None:
        """The engine's side of a token gap: the longest decode stall (engine thread)."""
        self._stall[priority].add(gap_s, now)

    def observe_token_gap(self, priority: Priority, gap_s: float) -> None:
        """Inter-token latency of a token the client got, as it got it (a stream's gap
        between chunk writes, a body's gap as the engine made it: ``ChoiceState.hand_out``).
        The server observes it on its event loop when it hands the token out, as vLLM's
        frontend does, so a token made after a stop string matched (the engine runs on
        until the abort lands) is not counted; the engine thread then leaves this
        histogram alone."""
        self._itl[priority].observe(gap_s)

    def observe_request_outputs(self, priority: Priority, longest: int) -> None:
        """One prompt's choices all ended: the most output tokens any of them got (vLLM's
        ``request_max_num_generation_tokens``, one observation per prompt whatever its
        ``n``: vLLM serves each prompt of a batch as its own request). Event loop only,
        as ``observe_delivered``."""
        self._req_max_generation[priority].observe(longest)

    def on_finished(self, priority: Priority, *, e2e_s: float | None, queue_s: float,
                    prompt_tokens: int, generation_tokens: int | None,
                    finish_reason: str | None, decode_s: float | None = None,
                    inference_s: float | None = None, prefill_s: float | None = None
                    ) -> None:
        """A request the engine finished. ``e2e_s``, ``generation_tokens`` and
        ``finish_reason`` None: the caller observes them itself, as delivered
        (``observe_delivered``, ``observe_request_outputs``). ``prefill_s`` (first
        scheduled to first token), ``decode_s`` (first token to last) and
        ``inference_s`` (first scheduled to last token), the engine's own phases as vLLM
        splits a request, observed here, at its finish, as vLLM observes all three:
        None for one that made no token (it had no such phases)."""
        if e2e_s is not None:
            self._e2e[priority].observe(e2e_s)
        self._queue[priority].observe(queue_s)
        self._req_prompt[priority].observe(prompt_tokens)
        if prefill_s is not None:
            self._prefill[priority].observe(prefill_s)
        if decode_s is not None:
            self._decode[priority].observe(decode_s)
        if inference_s is not None:
            self._inference[priority].observe(inference_s)
        if generation_tokens is not None:
            self._req_generation[priority].observe(generation_tokens)
            # Where the engine's events are the client's (the simulator), a request is
            # one choice: its longest output is its output.
            self._req_max_generation[priority].observe(generation_tokens)
        if finish_reason is not None:
            self._success[finish_reason] = self._success.get(finish_reason, 0) + 1

    # -- read on scrape --------------------------------------------------------------

    def render(self) -> bytes:
        """The registry's exposition, as ``generate_latest`` writes it (``metrics_text``):
        this engine's text, then its registry's other collectors' (the server's)."""
        return render(self.registry)

    def exposition(self) -> str:
        """This engine's own exposition text (``metrics_text.TextCollector``)."""
        return parts_text(self._parts())

    def describe(self) -> list[Metric]:
        # Lets the registry refuse a second engine with the same series at register time.
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        return families(self._parts())

    def _parts(self) -> Iterator[Part]:
        # The histograms as their text (``metrics_text``): most of the lines, formatted
        # once each, not again while unchanged. The small families as families.
        model = [self.model_name]
        now = self._clock()
        yield from self._histograms
        yield from self.iterations.parts(self.model_name)

        for name, doc, value in (
                ("vllm:num_requests_running", "Requests in the running batch.", self.num_running),
                ("vllm:num_requests_waiting", "Requests waiting to be admitted.",
                 self.num_waiting),
                ("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).",
                 self.kv_usage),
                ("slopilot_num_requests_swapped", "Requests whose KV is swapped to host.",
                 self.num_swapped),
                ("slopilot_busy_ratio", "Fraction of wall time the executor ran, over a "
                 "sliding window: the GPU-utilization stand-in.", self._busy.ratio(now))):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(model, value)
            yield g

        stall = GaugeMetricFamily(
            "slopilot_decode_stall_max_seconds",
            "Longest gap between two tokens of one request over the last 60 s.",
            labels=["model_name", "priority_class"])
        for p in Priority:
            stall.add_metric([self.model_name, p.label], self._stall[p].value(now))
        yield stall

        preempt = CounterMetricFamily(
            "vllm:num_preemptions_total", "Preemptions, each counted when its request next "
            "makes a token, as vLLM counts them (none for one that ends first).",
            labels=["model_name"])
        preempt.add_metric(model, self.preemptions_delivered)
        yield preempt
        by_mode = CounterMetricFamily("slopilot_preemptions_total",
                                      "Preemptions by mode, as they happen.",
                                      labels=["model_name", "mode"])
        by_mode.add_metric([self.model_name, "recompute"], self.preempted_recompute)
        by_mode.add_metric([self.model_name, "swap"], self.preempted_swap)
        yield by_mode
        for name, doc, count in (
                ("slopilot_swap_seconds_total", "Time spent copying KV blocks to and "
                 "from host memory, timed around the copies (a CUDA stream synchronized); "
                 "on the simulated executor, its cost model's time.", self.swap_seconds),
                ("vllm:prefix_cache_queries_total", "Prefix cache lookups, in tokens.",
                 self.prefix_queries),
                ("vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens.",
                 self.prefix_hits),
                ("vllm:prompt_tokens_total", "Prompt tokens of prefilled requests.",
                 self.prompt_tokens),
                ("vllm:generation_tokens_total", "Generated tokens.", self.generation_tokens)):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(model, count)
            yield c
        success = CounterMetricFamily("vllm:request_success_total", "Finished requests.",
                                      labels=["model_name", "finished_reason"])
        for reason, count in sorted(self._success.items()):
            success.add_metric([self.model_name, reason], count)
        yield success
        refused = CounterMetricFamily(
            REFUSED, "Requests turned away for load (429: the waiting queue was full), "
            "or refused at the connection cap (503: --max-connections, by the priority "
            "header's class), never served.", labels=["model_name", "priority_class"])
        retries = CounterMetricFamily(
            RETRIES, "Retries (x-stainless-retry-count above 0) by outcome: turned away "
            f"for load (not counted in {REFUSED.removesuffix('_total')}: their call was, "
            "at its first try) or admitted.",
            labels=["model_name", "priority_class", "outcome"])
        abandoned = CounterMetricFamily(
            ABANDONED, "Requests (each choice) that ended before a first token reached "
            "the client: it left, a drain aborted it, or its answer failed. Never "
            f"observed in the TTFT histogram; {WITHIN_TTFT_TARGET}: whether it ended "
            "within its class's TTFT target (false: past it, or no target).",
            labels=["model_name", "priority_class", WITHIN_TTFT_TARGET])
        arrived = CounterMetricFamily(
            ARRIVED, "Requests (each choice) offered to the engine, first tries: let in, "
            "turned away at the door for load, or refused at the connection cap (one "
            "each).", labels=["model_name", "priority_class"])
        for p in Priority:  # at 0 from the start: rate() misses a counter's first value
            refused.add_metric([self.model_name, p.label], self._refused[p])
            arrived.add_metric([self.model_name, p.label], self._arrived[p])
            for within in (False, True):
                abandoned.add_metric([self.model_name, p.label, str(within).lower()],
                                     self._abandoned[p, within])
            for outcome, was_refused in (("refused", True), ("admitted", False)):
                retries.add_metric([self.model_name, p.label, outcome],
                                   self._retries[p, was_refused])
        awaiting = GaugeMetricFamily(
            AWAITING, "Requests (each choice) let in and given no first token yet; "
            f"{WITHIN_TTFT_TARGET}: whether each has waited within its class's TTFT target "
            "(false: past it).", labels=["model_name", "priority_class", WITHIN_TTFT_TARGET])
        for (p, within), n in sorted(self.awaiting.counts().items()):
            awaiting.add_metric([self.model_name, p.label, str(within).lower()], n)
        yield refused
        yield arrived
        yield abandoned
        yield awaiting
        yield retries
        send_timeouts = CounterMetricFamily(
            SEND_TIMEOUTS, "Connections dropped because their client took no byte of its "
            "answer for the send deadline (--send-timeout); their requests count as "
            "aborted.", labels=["model_name"])
        send_timeouts.add_metric(model, self.send_timeouts)
        yield send_timeouts
        yield from self._verdicts.families(self.model_name)
        yield from self._info_families()

    def _info_families(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("slopilot_engine_info", "Engine build and model (always 1).",
                                 labels=["model_name", *sorted(self._info)])
        info.add_metric([self.model_name, *(self._info[k] for k in sorted(self._info))], 1)
        yield info
        if not self._config:
            return
        config = GaugeMetricFamily("slopilot_config_info", "Live knobs as labels (always 1).",
                                   labels=["model_name", *self._config])
        config.add_metric([self.model_name, *self._config.values()], 1)
        yield config
        knob = GaugeMetricFamily("slopilot_config_knob", "Live numeric knobs, one per series.",
                                 labels=["model_name", "knob"])
        for name, value in sorted(self._knobs.items()):
            knob.add_metric([self.model_name, name], value)
        yield knob
