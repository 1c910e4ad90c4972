"""Where a backend's TTFT and TBT histograms come from, as the recording rules read them.

The built-in engine observes both at its own writes to the client (TTFT at a choice's
first chunk written, gaps between chunk writes): its histograms are the client's figures.
vLLM's are its engine's: TTFT from when its engine client took the request to when it
took the first engine output, and gaps between the engine core's steps. The arrival is
stamped once the API server has parsed the request, rendered its chat template and
tokenized its prompt (v0.11: ``v1/engine/processor.py:349-350``, after
``serving_chat.py:239`` or ``serving_completion.py:136-141``), so neither holds that
work, nor detokenizing, serializing and the write after (nor a busy API server's event
loop, vLLM's known bottleneck under load): they read low against what clients measure.
The meter in each vLLM pod observes what its clients see (``engine/meter/client_latency``);
the rules read it wherever it observed a stream in the window, and vLLM's where it
observed none (a deployment whose clients ask for bodies, or a pod without a meter).

A request that never got a first token is in no TTFT histogram: one turned away for load
(429), one refused at the connection cap (503, ``--max-connections``) and one whose client
left before its first token (a stall's queue, vLLM's, which answers no 429). Each TTFT
histogram names the counters of those (``Histogram.never``), which the rules read as
observations in its +Inf bucket (``rules.bucket_rates``): the built-in engine counts all
three (a refusal at its cap among its refusals), the meter the requests it refused at its
cap and the streams cut short before a first token; of those cut short, only the ones
whose client had waited past its TTFT target (a client gone within it missed nothing:
``slo.WITHIN_TTFT_TARGET``). So are the requests still waiting for one at the window's
end past their target (``Histogram.waiting``, gauges: a class the config starves, whose
clients have not given up yet), as the simulator ranks its censored TTFTs
(``engine/awaiting.py``).

The operator picks a backend's sources once (``operator.service_monitor.latency_sources``), and
passes them to the rules, the trial windows and the dashboard alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.meter.client_latency import (
    CLIENT_ABANDONED,
    CLIENT_AWAITING,
    CLIENT_TBT,
    CLIENT_TTFT,
)
from slopilot.engine.meter.exposition import IN_FLIGHT, METER_REFUSED
from slopilot.engine.metric_names import ABANDONED, AWAITING, REFUSED

TTFT = "vllm:time_to_first_token_seconds"
TBT = "vllm:inter_token_latency_seconds"

VLLM_LATENCY_BUCKETS: Mapping[str, Sequence[float]] = MappingProxyType({
    # vLLM's own edges (v1 engine, vllm/v1/metrics/loggers.py); the standard profile's
    # P0 TBT SLO (20 ms) falls between two of them.
    TTFT: (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    TBT: (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
          10.0, 20.0, 40.0, 80.0),
})
"""vLLM's latency histogram edges (seconds, finite), by metric name."""


@dataclass(frozen=True)
class Histogram:
    """A latency histogram: its name (without ``_bucket``) and its finite edges."""

    metric: str
    edges: tuple[float, ...]
    never: tuple[str, ...] = ()
    """Counters (by ``priority_class``) of the requests it never observed because no
    first token reached their client: each one an observation in +Inf (TTFT only)."""
    waiting: tuple[str, ...] = ()
    """Gauges (by ``priority_class``) of the requests given no first token yet: those
    past their TTFT target at the window's end, each an observation in +Inf (TTFT only)."""


@dataclass(frozen=True)
class LatencySource:
    """One figure's histograms. ``engine``: the backend's own, on every replica.
    ``client``: one observed at the client's side (the meter's), read instead wherever
    it observed any in the window; None where the engine's are the client's already."""

    engine: Histogram
    client: Histogram | None = None


@dataclass(frozen=True)
class LatencySources:
    """A backend's TTFT and TBT sources."""

    ttft: LatencySource
    tbt: LatencySource
    in_flight: str | None = None
    """A gauge of the requests in flight at each replica, by the client's side (the
    meter's), where the engine's own running and waiting gauges may be stale; None where
    they are not (the built-in engine's). The stall rule reads it beside them."""

    def edges(self, metric: str) -> tuple[float, ...]:
        """``metric``'s bucket edges (an unknown one's: the built-in engine's)."""
        for source in (self.ttft, self.tbt):
            for hist in (source.engine, source.client):
                if hist is not None and hist.metric == metric:
                    return hist.edges
        return TOKEN_LATENCY_BUCKETS


BUILTIN_LATENCY = LatencySources(
    ttft=LatencySource(Histogram(TTFT, TOKEN_LATENCY_BUCKETS, never=(REFUSED, ABANDONED),
                                 waiting=(AWAITING,))),
    tbt=LatencySource(Histogram(TBT, TOKEN_LATENCY_BUCKETS)))
"""The built-in engine: its histograms, observed at its writes, are the client's."""

VLLM_LATENCY = LatencySources(
    # vLLM refuses nothing for load (it queues), and its own histogram drops a request
    # whose client left: the meter counts those, and those it refused at its connection
    # cap (503), beside either histogram. Beside vLLM's too: where the meter saw no first
    # token (its clients ask for bodies, which it does not time), a stream cut short is
    # one more never given among vLLM's, not the class.
    ttft=LatencySource(Histogram(TTFT, tuple(VLLM_LATENCY_BUCKETS[TTFT]),
                                 never=(CLIENT_ABANDONED, METER_REFUSED),
                                 waiting=(CLIENT_AWAITING,)),
                       client=Histogram(CLIENT_TTFT, TOKEN_LATENCY_BUCKETS,
                                        never=(CLIENT_ABANDONED, METER_REFUSED),
                                        waiting=(CLIENT_AWAITING,))),
    tbt=LatencySource(Histogram(TBT, tuple(VLLM_LATENCY_BUCKETS[TBT])),
                      client=Histogram(CLIENT_TBT, TOKEN_LATENCY_BUCKETS)),
    # vLLM may hold its running and waiting gauges from its last step once every
    # request was aborted: the meter counts its own.
    in_flight=IN_FLIGHT)
"""vLLM behind the meter: the meter's client-side histograms, else vLLM's own."""
