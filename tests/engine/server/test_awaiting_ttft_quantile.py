"""A class starved of first tokens reads as missing its TTFT target before its clients
give up.

The engine's own series, as a scrape of its ``/metrics`` gives them, go through the rules
the operator renders (promtool): 100 P1 first tokens in about 30 ms every 15 s (400 in
the rules' 1 min window), and six P1 streams let in and given no first token yet when the
window ends. Waiting past P1's target (500 ms), they are first tokens never given, as the
simulator ranks its censored TTFTs: 6 of 406, the P99 falls among them (the top edge,
300 s). Waiting within it, they missed nothing
yet, and the P99 is the served requests' own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.metric_names import AWAITING
from slopilot.engine.request import Priority
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.protocol import CompletionRequest
from slopilot.engine.server.request_stream import RequestStream
from slopilot.engine.server.responses import Delivery
from slopilot.engine.server.serving import prepare
from slopilot.engine.slo import SLOSpec
from tests.engine.server.test_abandoned_count import _Aborts
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.live_server import build_backend
from tests.support.prometheus import PrometheusBinaries
from tests.tuner.test_stall_alerts import ident, labels, rules_file, run

TTFT = "vllm:time_to_first_token_seconds"
SLO = SLOSpec.from_profile("strict")  # P1: TTFT 500 ms
ARRIVAL = 10.0
WAITING = 6


def _served_and_waiting(waited_s: float) -> tuple[Backend, list[Delivery]]:
    """A backend whose P1 served 100 first tokens in 30 ms, and six of whose P1 streams
    have waited ``waited_s`` for theirs (the deliveries, to settle)."""
    backend = build_backend(realtime=False)
    backend.metrics.set_slo(SLO)
    for _ in range(100):
        backend.metrics.observe_ttft(Priority.P1, 0.03)
    deliveries = []
    for _ in range(WAITING):
        body = CompletionRequest(prompt="one two three", max_tokens=50, ignore_eos=True,
                                 stream=True)
        prep = prepare(backend, body, {}, arrival_time=ARRIVAL)
        streams = [RequestStream(c.request, _Aborts()) for c in prep.choices]
        deliveries.append(Delivery(backend, prep, streams, lambda: ARRIVAL + waited_s,
                                   slo=backend.metrics.slo))
    return backend, deliveries


def _input_series(backend: Backend) -> list[dict[str, str]]:
    """The TTFT histogram growing by its value every 15 s, and the gauge of the requests
    awaiting a first token as it reads now, held."""
    out = []
    for family in text_string_to_metric_families(backend.metrics.render().decode()):
        for s in family.samples:
            own = {k: v for k, v in s.labels.items() if k != "model_name"}
            if s.name == f"{TTFT}_bucket":
                out.append({"series": s.name + labels(**own), "values": f"0+{s.value:g}x20"})
            elif s.name == AWAITING:
                out.append({"series": s.name + labels(**own), "values": f"{s.value:g}x20"})
    return out


def _p99(value: float) -> list[dict[str, Any]]:
    return [{"expr": 'slopilot:ttft_seconds:p99{priority_class="p1"}', "eval_time": "3m",
             "exp_samples": [{"labels": "slopilot:ttft_seconds:p99{" + ",".join(
                 f'{k}="{v}"' for k, v in ident(priority_class="p1").items()) + "}",
                 "value": value}]}]


def test_the_gauge_counts_each_stream_until_its_first_token_or_its_end() -> None:
    backend, deliveries = _served_and_waiting(0.6)
    past = {(p, within): n for (p, within), n in backend.metrics.awaiting.counts().items()
            if n}
    assert past == {(Priority.P1, False): WAITING}
    first, second, *rest = deliveries
    first.first_output(first.states[0])
    second.close()  # ended with no first token: counted abandoned, no longer waiting
    rest[0].refused()  # displaced before it started: a refusal, no longer waiting
    assert backend.metrics.awaiting.counts()[Priority.P1, False] == WAITING - 3


@pytest.mark.prometheus
def test_streams_waiting_past_the_target_put_the_p99_over_it(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    backend, _ = _served_and_waiting(0.6)
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "strict"})]
    # 6 of 406 never given a first token: the P99 is among them, the top finite edge.
    run(prometheus_binaries, tmp_path, files, _input_series(backend), [],
        _p99(TOKEN_LATENCY_BUCKETS[-1]))


@pytest.mark.prometheus
def test_streams_waiting_within_the_target_leave_the_p99_to_the_served(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    backend, _ = _served_and_waiting(0.017)
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "strict"})]
    edge = next(e for e in TOKEN_LATENCY_BUCKETS if e >= 0.03)
    low = max(e for e in TOKEN_LATENCY_BUCKETS if e < 0.03)
    run(prometheus_binaries, tmp_path, files, _input_series(backend), [],
        _p99(low + (edge - low) * 0.99))
