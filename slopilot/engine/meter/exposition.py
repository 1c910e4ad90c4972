"""The meter's ``GET /metrics``: vLLM's exposition, with the meter's own after it.

vLLM's exposition (asked for in the text format, whose names keep their colons), then
the verdict counters (``Verdicts.families``), then the client-side histograms and the
choices cut short before a first token, then the Responses streams replayed, then the
requests arrived, those of them refused as invalid and those refused at the connection
cap, then when the meter started,
then those in flight, then the connection cap's counts (``connection_cap.py``): one
answer, one ``instance``, so the goodput rule joins vLLM's tokens and the verdicts per
replica, the workload probe tells a replica that counts its arrivals from one that does
not, and takes each replica's invalid requests off its own arrivals, and the stall rule
reads a replica's vLLM gauges beside its meter's requests in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from slopilot.engine.connection_cap import SERIES as CONNECTION_SERIES
from slopilot.engine.meter.asgi_http import Send, answer, date_header, response_headers
from slopilot.engine.meter.client_latency import (
    CLIENT_ABANDONED,
    CLIENT_AWAITING,
    CLIENT_SERIES,
    ClientLatency,
)
from slopilot.engine.metrics_text import TextRegistry, parts_text
from slopilot.engine.openai_errors import error_body
from slopilot.engine.request import Priority
from slopilot.engine.slo import WITHIN_TTFT_TARGET
from slopilot.engine.verdicts import SLO_REQUESTS, SLO_TOKENS, Verdicts

REPLAYED_STREAMS = "slopilot_meter_replayed_streams"
"""Responses streamed again by GET (``is_replay``), counted, not judged (base name)."""
ARRIVALS = "slopilot_meter_arrivals_total"
"""The requests for generation the meter forwarded, counted as they came (``Meter.arrivals``),
by the name Prometheus stores: the workload probe's arrivals on a replica that exports it
(``tuner/prometheus/profiling``)."""
INVALID = "slopilot_meter_invalid_total"
"""Of ``ARRIVALS``, those the engine answered with a client's error (``Meter.invalid``):
never served, so never load; the workload probe takes them off the replica's arrivals."""
METER_REFUSED = "slopilot_meter_refused_total"
"""Of ``ARRIVALS``, the requests for generation the meter refused at its connection cap
(503, ``--max-connections``; ``Meter.count_cap_refusal``), in its class: never forwarded,
no first token given. The rules read them beside both TTFT histograms as first tokens
never given (``latency_sources.VLLM_LATENCY``), as the built-in engine's refusals."""
METER_START = "slopilot_meter_start_time_seconds"
"""When this meter started (Unix time): its client-side histograms, the P99s a vLLM
deployment is judged on, began again at 0 then, which Prometheus cannot tell once they
pass their old values; a trial window in which it moved is rejected
(``tuner/prometheus/adapters``). vLLM's own ``process_start_time_seconds`` is in its
exposition already, and the meter's process is another."""
IN_FLIGHT = "slopilot_meter_requests_in_flight"
"""The requests for generation the meter forwarded whose exchange has not ended (answered
in full, the client gone, the engine failed or broke off): a gauge, which the stall rule
reads beside vLLM's own, whose running and waiting gauges may hold their last step's
values once every request was aborted (``rules._Renderer.stalled_replicas``)."""
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


def meter_series() -> frozenset[str]:
    """Every series the meter adds to vLLM's, by the name Prometheus stores: with vLLM's
    own, all a vLLM deployment's queries (its dashboard's, its rules') may read."""
    names = {SLO_REQUESTS, SLO_TOKENS, f"{REPLAYED_STREAMS}_total", ARRIVALS, INVALID,
             METER_REFUSED, CLIENT_ABANDONED, CLIENT_AWAITING, METER_START, IN_FLIGHT,
             *CONNECTION_SERIES}
    for histogram in CLIENT_SERIES:
        names |= {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"}
    return frozenset(names)


class Scraped(Protocol):
    """What of a meter its own exposition reads, as it stands at the scrape."""

    verdicts: Verdicts
    latency: ClientLatency
    model_name: str
    priority: Priority
    replays: int
    arrivals: int
    invalid: int
    refused: int
    in_flight: int

    def awaiting(self) -> Mapping[bool, int]:
        """Choices of the streams running given no first token yet, by whether their
        client has waited within its TTFT target."""
        ...


def own_registry(meter: Scraped) -> TextRegistry:
    """The meter's own families: the verdicts, the client-side histograms, the choices
    cut short before a first token, the replays, the arrivals, the invalid ones and
    those refused at the cap, scraped in this order."""
    registry = TextRegistry()
    registry.register(_VerdictCollector(meter))
    registry.register(_LatencyCollector(meter))
    registry.register(_AbandonedCollector(meter))
    registry.register(_AwaitingCollector(meter))
    registry.register(_ReplayCollector(meter))
    registry.register(_ArrivalCollector(meter))
    registry.register(_StartCollector(time.time()))
    registry.register(_InFlightCollector(meter))
    return registry


class _StartCollector(Collector):
    def __init__(self, started: float) -> None:
        self.started = started

    def collect(self) -> Any:
        yield GaugeMetricFamily(METER_START, "When this meter started, in Unix time: its "
                                "own series began again from 0 then.", value=self.started)


class _VerdictCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        return self.meter.verdicts.families(self.meter.model_name)


class _LatencyCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        return self.meter.latency.families(self.meter.model_name)

    def exposition(self) -> str:
        """Its text on a scrape (``metrics_text.TextCollector``)."""
        return parts_text(self.meter.latency.texts(self.meter.model_name))


class _AbandonedCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        # At 0 from the start, under the labels of the refusals' counter (the built-in
        # engine's): increase() reads nothing of a series' first sample.
        family = CounterMetricFamily(
            CLIENT_ABANDONED, "Choices of the streams cut short (the client left, the "
            "engine broke off or failed it) before their first token reached the client: "
            f"never observed as a TTFT; {WITHIN_TTFT_TARGET}: whether the client left "
            "within its class's TTFT target.",
            labels=["model_name", "priority_class", WITHIN_TTFT_TARGET])
        for within, count in sorted(self.meter.latency.abandoned.items()):
            family.add_metric([self.meter.model_name, self.meter.priority.label,
                               str(within).lower()], count)
        yield family


class _AwaitingCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            CLIENT_AWAITING, "Choices of the streams running given no first token yet; "
            f"{WITHIN_TTFT_TARGET}: whether their client has waited within its class's "
            "TTFT target (false: past it).",
            labels=["model_name", "priority_class", WITHIN_TTFT_TARGET])
        for within, count in sorted(self.meter.awaiting().items()):
            family.add_metric([self.meter.model_name, self.meter.priority.label,
                               str(within).lower()], count)
        yield family


class _ReplayCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        family = CounterMetricFamily(
            REPLAYED_STREAMS, "Responses re-streamed by GET /v1/responses/{id}?stream=true "
            "(a stored answer's events again): passed on, not judged.",
            labels=["priority_class"])
        family.add_metric([self.meter.priority.label], self.meter.replays)
        yield family


class _ArrivalCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        # At 0 from the start: increase() reads nothing of a series' first sample, and
        # a replica that exports it is read by it even before its first request. Both
        # under one set of labels, so the probe subtracts one from the other by series.
        labels = [self.meter.model_name, self.meter.priority.label]
        for name, doc, count in (
                (ARRIVALS, "Requests for generation forwarded to the engine, counted as "
                 "they came: each prompt of a batch and each of its n choices, as the "
                 "engine counts its requests; those whose clients gave up too (the "
                 "engine's series drop them).", self.meter.arrivals),
                (INVALID, "Of the requests counted as they came, those the engine "
                 "answered with a client's error (4xx but 429: a prompt past the context, "
                 "a bad parameter, no such model), counted as many times again: refused "
                 "unserved, no load.", self.meter.invalid),
                (METER_REFUSED, "Of the requests counted as they came, those for "
                 "generation the meter refused at its connection cap (503: "
                 "--max-connections), one each, never forwarded: no first token given.",
                 self.meter.refused)):
            family = CounterMetricFamily(name, doc, labels=["model_name", "priority_class"])
            family.add_metric(labels, count)
            yield family


class _InFlightCollector(Collector):
    def __init__(self, meter: Scraped) -> None:
        self.meter = meter

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            IN_FLIGHT, "Requests for generation forwarded to the engine whose exchange "
            "has not ended (answered in full, the client gone, the engine failed or broke "
            "off).", labels=["model_name", "priority_class"])
        family.add_metric([self.meter.model_name, self.meter.priority.label],
                          self.meter.in_flight)
        yield family


async def scrape(client: httpx.AsyncClient, upstream: str, send: Send,
                 render: Callable[[], bytes]) -> None:
    """vLLM's exposition in the text format, then the verdicts' and the client-side
    histograms' (``render``, once vLLM answered). An upstream that does not answer
    fails the scrape (502): Prometheus then marks the replica down rather than reading
    verdicts without the tokens they are a share of."""
    try:
        response = await client.get(
            upstream + "/metrics", headers={"accept": TEXT_FORMAT,
                                            "accept-encoding": "identity"})
    except httpx.HTTPError as exc:
        await answer(send, 502, error_body(
            502, f"the engine's /metrics did not answer: {type(exc).__name__}",
            code="upstream_unavailable"))
        return
    kind = response.headers.get("content-type", "")
    if response.status_code != 200 or not kind.startswith("text/plain"):
        # Passed on as it came: another format would not take the verdicts after it.
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response_headers(response.headers, keep_length=False)})
        await send({"type": "http.response.body", "body": response.content})
        return
    own = render()
    text = response.content
    if text and not text.endswith(b"\n"):
        text += b"\n"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()), date_header()]})
    await send({"type": "http.response.body", "body": text + own})
