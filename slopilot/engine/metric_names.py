"""Every series the engine and its server export, by the name Prometheus stores.

Named like vLLM's wherever vLLM has the series, so one set of rules serves both; the
rest are ``slopilot_*``. The rules, the dashboards and the tuner's queries name series
from here, and the tests hold each name a query uses against ``exported_series``.
"""

from __future__ import annotations

from slopilot.engine.connection_cap import CONNECTIONS_REFUSED as CONNECTIONS_REFUSED
from slopilot.engine.connection_cap import SERIES as CONNECTION_CAP_SERIES
from slopilot.engine.iteration_metrics import ITERATION_HISTOGRAMS, ITERATION_SERIES
from slopilot.engine.verdicts import SLO_REQUESTS, SLO_TOKENS

# Every series EngineMetrics exports, by the name Prometheus stores (histograms by base name).
VLLM_METRICS: frozenset[str] = frozenset({
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:iteration_tokens_total",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:request_max_num_generation_tokens",
})
# Requests turned away for load (429: the waiting queue held max_waiting, at the door or
# displaced from it before they started by a more urgent class), and requests for
# generation refused at the connection cap (503, ``--max-connections``: by the priority
# header's class, else the default one; ``server/cap_refusals.py``): their clients were
# never served, each counted in its own class. The TTFT percentiles read each as a first
# token never given.
REFUSED = "slopilot_requests_refused_total"
# Requests (each choice) offered to the engine, first tries, counted as the server hands
# them to it: those it let in and those it turned away at the door for load; and those
# refused at the connection cap, one a request, before the engine saw them. The workload
# probe bins its raw samples to read how bursty the arrivals are
# (``tuner/prometheus/burstiness.py``): a bursty load planned as Poisson read as calm.
ARRIVED = "slopilot_requests_arrived_total"
# Requests whose client left (or whose answer failed) before a first token reached it,
# counted per choice as the TTFT histogram observes them: a request queued behind a stall
# until its client gave up is never observed there. The TTFT percentiles read each as a
# first token never given, as a refusal, where its client had waited past its class's
# TTFT target (label ``slo.WITHIN_TTFT_TARGET`` "false"); one that left within it missed
# nothing.
ABANDONED = "slopilot_requests_abandoned_total"
# Requests (each choice) given no first token yet at the scrape, by class and by whether
# each has waited past its class's TTFT target (label ``slo.WITHIN_TTFT_TARGET``; by
# ``awaiting.past_target``): a gauge. The rules read those past it at a window's end as
# first tokens never given, as the simulator's censored TTFTs (``engine/awaiting.py``):
# a class the config starves is in no TTFT histogram until its clients give up.
AWAITING = "slopilot_requests_awaiting_first_token"
# Retries (the client numbers its tries) by what became of them (``outcome``: refused,
# or admitted): one call turned away is counted once in REFUSED however often its
# client retries, and the size of a retry storm shows here.
RETRIES = "slopilot_request_retries_total"
# Connections dropped by the send deadline (``slopilot serve --send-timeout``): their
# client took no byte of its answer for that long. Each one's requests are counted in
# vllm:request_success_total as aborted too. vLLM has no such deadline, nor a series.
SEND_TIMEOUTS = "slopilot_send_timeouts_total"
# The share of wall time the built-in engine's executor ran, over its last 30 s: the
# GPU-utilization stand-in. vLLM exports none.
BUSY = "slopilot_busy_ratio"
SLOPILOT_METRICS: frozenset[str] = frozenset({
    "slopilot_preemptions_total", BUSY, "slopilot_swap_seconds_total",
    "slopilot_decode_stall_max_seconds", "slopilot_num_requests_swapped",
    "slopilot_config_info", "slopilot_config_knob", "slopilot_engine_info",
    SLO_REQUESTS, SLO_TOKENS, REFUSED, ARRIVED, ABANDONED, AWAITING, RETRIES,
    SEND_TIMEOUTS,
}) | ITERATION_SERIES
HISTOGRAMS: frozenset[str] = frozenset({
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "vllm:iteration_tokens_total", "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
    "vllm:request_max_num_generation_tokens",
}) | ITERATION_HISTOGRAMS
# When the serving process started (prometheus_client's process collector, which vLLM's
# default registry holds too): a window whose replica's start moved read counters that
# began again, which Prometheus cannot tell once they pass their old values (a vLLM
# pod's meter says its own: meter/exposition.METER_START).
PROCESS_START = "process_start_time_seconds"
PROCESS_SERIES: frozenset[str] = frozenset({
    "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
    "process_virtual_memory_bytes", "process_resident_memory_bytes", PROCESS_START})
# The serving process's own series, beside its engine's (engine/server/gc_pauses.py).
GC_PAUSE_SECONDS = "slopilot_gc_pause_seconds"
SERVER_HISTOGRAMS: frozenset[str] = frozenset({GC_PAUSE_SECONDS})
# With client grants (``slopilot serve --clients``; engine/server/client_counts.py): the
# requests each client's grant let in, by the class served, and those refused, by reason.
CLIENT_REQUESTS = "slopilot_client_requests_total"
CLIENT_REFUSALS = "slopilot_client_refusals_total"
SERVER_COUNTERS: frozenset[str] = frozenset({CLIENT_REQUESTS, CLIENT_REFUSALS})
# The connection cap's (``--max-connections``; engine/connection_cap.py): requests refused
# for want of a slot (every path, no class: those for generation are in REFUSED by class
# too, the meter's in ``slopilot_meter_refused_total``), the slots held, and the cap. The
# meter exports them too.
CONNECTION_SERIES: frozenset[str] = CONNECTION_CAP_SERIES


def exported_series() -> frozenset[str]:
    """Every series name a query may use, histograms expanded to _bucket/_sum/_count."""
    names = set(VLLM_METRICS | SLOPILOT_METRICS | SERVER_HISTOGRAMS | SERVER_COUNTERS
                | CONNECTION_SERIES | PROCESS_SERIES)
    for h in HISTOGRAMS | SERVER_HISTOGRAMS:
        names |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    return frozenset(names)
