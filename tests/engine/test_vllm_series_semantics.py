"""The engine's vllm:* series counted where, and as, vLLM v1 counts them.

Each test names the vLLM code it holds the engine to: vLLM 0.11.0's, the image the
operator pins (vllm/v1/metrics/loggers.py ``PrometheusStatLogger.record``,
vllm/v1/metrics/stats.py ``IterationStats``), but for the prefix cache's lookups, an
iteration's prompt tokens and the finish reasons, which the engine counts as vLLM 0.34
does, on purpose (each section says so). The table of every series, and why, is in
docs/architecture.md, "The vllm:* series".
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.config import EngineConfig
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.metrics import VLLM_FINISH_REASONS, EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.request import FinishReason, Priority, RequestStatus
from tests.engine.helpers import make_request, make_scheduler, step
from tests.support.fake_executor import FakeExecutor


def _engine(num_blocks: int = 1000, **knobs: object) -> tuple[LLMEngine, EngineMetrics]:
    clock = VirtualClock(100.0)
    metrics = EngineMetrics("tiny", clock=clock.now)
    cfg = EngineConfig().with_overrides({"budget_align": 1, **knobs})
    engine = LLMEngine(cfg, FakeExecutor(), num_blocks, clock=clock,
                       observers=[MetricsObserver(metrics)])
    return engine, metrics


def _samples(metrics: EngineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _total(metrics: EngineMetrics, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in _samples(metrics).items()
               if n == name and set(labels.items()) <= set(ls))


# -- prefix cache: vLLM 0.34's vllm/v1/core/kv_cache_manager.py record_prefix_cache_stats,
# at admission (0.11 counts every lookup of a waiting request: get_computed_blocks) -----

def test_no_lookup_no_query_with_caching_off_or_prompt_logprobs() -> None:
    # vLLM counts only requests that looked the cache up (prefix_cache_lookup_enabled):
    # none with caching off, none that asks for prompt logprobs (it skips reading the
    # cache). Counted as misses, a deployment without caching read a 0 % hit ratio
    # where vLLM's has none.
    off = make_scheduler(enable_prefix_caching=False)
    off.add_request(make_request("a", 40))
    step(off)
    assert (off.prefix_queries, off.prefix_hits) == (0, 0)
    on = make_scheduler()
    on.add_request(make_request("logprobs", 40, prompt_logprobs=1))
    on.add_request(make_request("plain", 40, first_token=5000))
    step(on)
    assert (on.prefix_queries, on.prefix_hits) == (40, 0)


# -- preemptions: vllm/v1/metrics/stats.py IterationStats.update_from_events -----------

def _preempt_one(engine: LLMEngine) -> None:
    """Run until the P0 newcomer preempts the P1 victim (recompute)."""
    engine.add_request(make_request("victim", 64, max_tokens=10))
    engine.step()
    engine.add_request(make_request("p0", 40, max_tokens=30, priority=Priority.P0,
                                    first_token=5000))
    engine.step()
    assert engine.scheduler.requests["victim"].status is RequestStatus.PREEMPTED_RECOMPUTE


def test_a_preemption_counts_when_its_victim_next_makes_a_token() -> None:
    # vLLM's scheduler records PREEMPTED on the request, and the event reaches the
    # frontend (num_preempted_reqs) with that request's next output: a victim counts
    # once it makes a token again, each of its preemptions then.
    engine, metrics = _engine(num_blocks=6, kv_watermark=0.0, preemption_mode="recompute",
                              p0_preempt_utilization=0.1)
    _preempt_one(engine)
    assert _total(metrics, "vllm:num_preemptions_total") == 0
    # slopilot's own series counts it where it happened, by mode.
    assert _total(metrics, "slopilot_preemptions_total", mode="recompute") == 1
    victim = engine.scheduler.requests["victim"]
    while victim.num_output_tokens < 2:
        engine.step()
    assert _total(metrics, "vllm:num_preemptions_total") == 1
    engine.run_until_idle()
    assert _total(metrics, "vllm:num_preemptions_total") == 1


def test_a_victim_that_ends_without_another_token_never_counts() -> None:
    # Its client left while it waited: vLLM's frontend drops the request's state at the
    # abort, and the event with it.
    engine, metrics = _engine(num_blocks=6, kv_watermark=0.0, preemption_mode="recompute",
                              p0_preempt_utilization=0.1)
    _preempt_one(engine)
    engine.abort_request("victim")
    engine.run_until_idle()
    assert _total(metrics, "vllm:num_preemptions_total") == 0
    assert _total(metrics, "slopilot_preemptions_total", mode="recompute") == 1


# -- request phases: vllm/v1/metrics/loggers.py, the finished_requests loop -------------

def test_the_prefill_phase_is_observed_when_the_request_finishes() -> None:
    # vLLM observes request_prefill_time_seconds (first scheduled to first token) with
    # the other phases, per finished request. At the first token, a window's prefill
    # count was the requests that started in it, its decode count those that ended.
    engine, metrics = _engine()
    engine.add_request(make_request("a", 40, max_tokens=5))
    engine.step()
    req = engine.scheduler.requests["a"]
    assert req.first_token_time is not None
    assert _total(metrics, "vllm:request_prefill_time_seconds_count") == 0
    engine.run_until_idle()
    assert _total(metrics, "vllm:request_prefill_time_seconds_count") == 1
    assert _total(metrics, "vllm:request_prefill_time_seconds_sum") == \
        req.first_token_time - req.first_scheduled_time
    assert _total(metrics, "vllm:request_decode_time_seconds_count") == 1


# -- iteration tokens: loggers.py record(), histogram_iteration_tokens ------------------

def _iterations(metrics: EngineMetrics) -> tuple[float, float]:
    """(count, sum) of vllm:iteration_tokens_total."""
    return (_total(metrics, "vllm:iteration_tokens_total_count"),
            _total(metrics, "vllm:iteration_tokens_total_sum"))


def test_an_iteration_counts_the_tokens_it_made_and_the_prefills_it_ended() -> None:
    # vLLM 0.34 observes, per engine step that has outputs, prompt_token_stats.computed
    # (the prompt less its prefix-cache hit, of each request whose first token came in
    # it) plus the tokens generated (0.11: the whole prompt): a chunked prefill counts
    # whole in the step it ends, its earlier chunks not at all.
    engine, metrics = _engine(chunk_size=64, token_budget=128)
    engine.add_request(make_request("long", 150, max_tokens=3))
    engine.step()  # 64 of its prompt
    engine.step()  # 64 more
    assert _iterations(metrics) == (0, 0)
    engine.step()  # the last 22, and its first token
    assert _iterations(metrics) == (1, 150 + 1)
    engine.step()  # a decode
    assert _iterations(metrics) == (2, 152)
    # The same prompt again: its cache holds 144 tokens (9 blocks of 16; the last token
    # is always computed), so its prefill counts 6.
    engine.add_request(make_request("again", 150, max_tokens=2))
    engine.step()
    assert _iterations(metrics) == (3, 152 + 1 + 6 + 1)  # with "long"'s last token


def test_a_decode_beside_a_chunk_that_samples_nothing_counts_one() -> None:
    engine, metrics = _engine(chunk_size=64, token_budget=128)
    engine.add_request(make_request("short", 10, max_tokens=5))
    engine.step()
    before = _iterations(metrics)
    engine.add_request(make_request("long", 150, max_tokens=2, first_token=5000))
    engine.step()  # "short" decodes one token; "long" prefills 64 of 150
    count, total = _iterations(metrics)
    assert (count - before[0], total - before[1]) == (1, 1)


# -- finish reasons: loggers.py counter_request_success, one per FinishReason (0.11's
# stop, length and abort; error and repetition are vLLM 0.34's, always 0 here) ---------

def test_every_finish_reason_vllm_exports_is_there_from_the_start() -> None:
    # vLLM makes vllm:request_success_total for each of its FinishReasons at start: a
    # rule on finished_reason="error" reads 0 there, and nothing (no data) here.
    _, metrics = _engine()
    reasons = {dict(ls)["finished_reason"]: v for (n, ls), v in _samples(metrics).items()
               if n == "vllm:request_success_total"}
    assert reasons == {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
    assert {r.value for r in FinishReason} <= set(VLLM_FINISH_REASONS)


# -- bucket edges: vllm/v1/metrics/loggers.py request_latency_buckets (0.11) ------------

VLLM_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                7680.0)


def test_the_request_phase_histograms_have_every_edge_of_vllms() -> None:
    # vLLM's request_latency_buckets, of e2e, queue and the three phases: a query on
    # one of its edges (le="0.8") reads the built-in engine's series too.
    _, metrics = _engine()
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time",
                 "request_decode_time", "request_inference_time"):
        edges = {float(dict(ls)["le"]) for (n, ls), _ in _samples(metrics).items()
                 if n == f"vllm:{name}_seconds_bucket"}
        assert set(VLLM_REQUEST_LATENCY_BUCKETS) <= edges, name
