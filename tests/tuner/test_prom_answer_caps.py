"""One tenant's Prometheus answers cost the operator no more than their share.

A tenant may point ``spec.prometheus.url`` at a server of its own, and every answer is
parsed with ``json.loads``, which holds the GIL to its end: valid 7.9 MiB vectors (under
the old one-size 8 MiB cap), four steps at once, stalled every other namespace's steps
for seconds. Each reader's cap is now what its queries can really return
(``bounded.answer_cap``, ``ALERTS_ANSWER_BYTES``), and each namespace's answers come out
of a budget of bytes a minute (``answer_budget``), refused before they are parsed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from slopilot.operator import pod_layout
from slopilot.tuner.prometheus import query as query_module
from slopilot.tuner.prometheus.alerts import AlertSource
from slopilot.tuner.prometheus.answer_budget import NamespaceBudgets
from slopilot.tuner.prometheus.bounded import (
    ALERTS_ANSWER_BYTES,
    MAX_ANSWER_BYTES,
    RAW_SPAN_S,
    SCRAPE_INTERVAL_S,
    answer_cap,
)
from slopilot.tuner.prometheus.burstiness import BURST_WINDOW_S
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.scrape_interval import LOOKBACK_S
from slopilot.tuner.study.evaluator import PrometheusUnavailable

KIB, MIB = 1024, 1024 * 1024


def _vector(series: int, pad: int = 0) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"i": f"{i:07d}", "pad": "x" * pad}, "value": [1000.0, "1"]}
        for i in range(series)]}}).encode()


def _serving(body: bytes, *, chunked: bool = False,
             served: list[int] | None = None) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if served is not None:
            served.append(len(body))
        if chunked:  # no Content-Length: the bytes are counted as they come
            return httpx.Response(200, content=iter([body[i:i + 64 * KIB]
                                                     for i in range(0, len(body), 64 * KIB)]),
                                  headers={"content-type": "application/json"})
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})
    return httpx.Client(transport=httpx.MockTransport(handle))


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the answers parsed."""
    seen: list[int] = []
    real = query_module._json

    def counting(body: bytes) -> Any:
        seen.append(len(body))
        return real(body)
    monkeypatch.setattr(query_module, "_json", counting)
    return seen


@pytest.mark.parametrize("chunked", [False, True])
def test_an_alerts_answer_past_what_alerts_can_be_is_refused_unparsed(
        parsed: list[int], chunked: bool) -> None:
    body = _vector(1000, pad=300)  # ~340 KiB: more than any deployment's alerts
    assert ALERTS_ANSWER_BYTES < len(body) < MAX_ANSWER_BYTES
    src = AlertSource("http://prom:9090", "chat", namespace="team",
                      client=_serving(body, chunked=chunked))
    with pytest.raises(PrometheusUnavailable, match="over the 256 KiB cap for this query"):
        src.firing()
    assert parsed == []


def test_the_caps_arithmetic() -> None:
    # The raw reads' span covers the longest of them (scrape_interval's, burstiness').
    assert max(LOOKBACK_S, BURST_WINDOW_S) <= RAW_SPAN_S
    assert SCRAPE_INTERVAL_S == pod_layout.SCRAPE_INTERVAL_S  # the ServiceMonitor's
    assert answer_cap(1, 120.0) == 256 * KIB + 8 * (1 * KIB + 61 * 40)
    assert 1.9 * MIB < answer_cap(64, 120.0) < 2.1 * MIB
    assert answer_cap(64, 3600.0) < MAX_ANSWER_BYTES == answer_cap(64, 86_400.0)
    with pytest.raises(ValueError, match="replicas >= 1"):
        answer_cap(0, 120.0)


def _raw_arrivals(replicas: int, samples: int) -> bytes:
    """The largest real raw read: each replica's arrivals counter, 3 classes and the
    unclassed, twice (the pod replaced in the span), a ServiceMonitor's labels at
    Kubernetes' longest names, a sample every 15 s."""
    name = "n" * 63
    result = []
    for r in range(replicas):
        for cls in ("p0", "p1", "p2", ""):
            for gen in range(2):
                metric = {"__name__": "slopilot_meter_arrivals_total", "priority_class": cls,
                          "namespace": name, "pod": f"{name[:50]}-{r:04d}-{gen}",
                          "instance": f"10.{r}.{gen}.1:8000", "job": name, "service": name,
                          "endpoint": "metrics", "container": name,
                          "slopilot_deployment": name, "slopilot_namespace": name}
                values = [[1733600000.123 + 15 * k, str(123456789 + k)]
                          for k in range(samples)]
                result.append({"metric": metric, "values": values})
    return json.dumps({"status": "success",
                       "data": {"resultType": "matrix", "result": result}}).encode()


@pytest.mark.parametrize("replicas", [1, 64])
def test_the_largest_real_raw_read_fits_its_cap(replicas: int) -> None:
    body = _raw_arrivals(replicas, samples=int(RAW_SPAN_S // SCRAPE_INTERVAL_S) + 1)
    cap = answer_cap(replicas, 120.0)
    assert len(body) < cap
    read = query_at("http://prom:9090", client=_serving(body), max_bytes=cap)
    assert len(read("slopilot_meter_arrivals_total[15m]", None)) == replicas * 8


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("chunked", [False, True])
def test_a_spent_namespace_is_refused_while_another_still_reads(
        parsed: list[int], chunked: bool) -> None:
    clock = FakeClock()
    budgets = NamespaceBudgets(bytes_per_min=4 * MIB, clock=clock)
    big = _vector(8000, pad=100)  # 1.26 MiB, under the cap of 64 replicas
    assert MIB < len(big) < answer_cap(64, 120.0)
    served: list[int] = []
    noisy = query_at("http://evil:9090", max_bytes=answer_cap(64, 120.0),
                     client=_serving(big, chunked=chunked, served=served),
                     charge=budgets.charge("noisy", "hog"))
    quiet = query_at("http://prom:9090", client=_serving(_vector(3)),
                     charge=budgets.charge("quiet", "chat"))
    for _ in range(3):  # 3.8 MiB of the 4
        assert len(noisy("up", None)) == 8000
    with pytest.raises(PrometheusUnavailable) as refused:
        noisy("up", None)
    message = str(refused.value)
    assert "LLMDeployment noisy/hog" in message and "4 MiB a minute" in message
    assert "spec.prometheus.url" in message
    assert parsed.count(len(big)) == 3  # the refused one was never parsed
    for _ in range(50):
        assert len(quiet("up", None)) == 3  # another namespace's budget is its own
    clock.now += 30.0  # half a minute: 2 MiB back, enough for one more
    assert len(noisy("up", None)) == 8000
    with pytest.raises(PrometheusUnavailable, match="noisy/hog"):
        noisy("up", None)


def test_a_declared_length_is_paid_before_any_of_it_is_read() -> None:
    clock = FakeClock()
    budgets = NamespaceBudgets(bytes_per_min=100 * KIB, clock=clock)
    body = _vector(1000)  # ~60 KiB
    read = query_at("http://prom:9090", client=_serving(body),
                    charge=budgets.charge("team", "chat"))
    read("up", None)
    left = budgets.budget("team").left()
    with pytest.raises(PrometheusUnavailable, match="team/chat"):
        read("up", None)
    assert budgets.budget("team").left() == left  # refused whole, nothing taken


def test_a_clock_stepped_back_refills_nothing() -> None:
    clock = FakeClock()
    budgets = NamespaceBudgets(bytes_per_min=60, clock=clock)
    budgets.charge("team", "chat")(60)
    clock.now -= 3600.0
    with pytest.raises(PrometheusUnavailable):
        budgets.charge("team", "chat")(1)
    clock.now += 1.0
    budgets.charge("team", "chat")(1)  # a second on from where it stepped back: 1 byte
