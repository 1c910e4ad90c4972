"""A client that leaves before its TTFT target does not make the TTFT P99 read 300 s.

The engine's own series, as a scrape of its ``/metrics`` gives them, go through the rules
the operator renders (promtool): 100 P1 first tokens in about 30 ms, and two clients that
left before theirs came. Had they waited past P1's target (500 ms), they missed it, and the
P99 falls among the first tokens never given (the top edge, 300 s; a stall's queue keeps
the alerts firing so). Had they left within it (a client's 15 ms timeout), they missed
nothing (the verdicts judge them so: docs/operations.md), and the P99 is the served
requests' own, with no TTFT alert.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.metric_names import ABANDONED, REFUSED
from slopilot.engine.request import Priority
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.protocol import CompletionRequest
from slopilot.engine.server.request_stream import RequestStream
from slopilot.engine.server.responses import Delivery
from slopilot.engine.server.serving import prepare
from slopilot.engine.slo import SLOSpec
from tests.engine.server.test_abandoned_count import _Aborts, _leave
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.live_server import build_backend
from tests.support.prometheus import PrometheusBinaries
from tests.tuner.test_stall_alerts import ident, labels, rules_file, run

TTFT = "vllm:time_to_first_token_seconds"
SLO = SLOSpec.from_profile("strict")  # P1: TTFT 500 ms
ARRIVAL = 10.0


def _served_and_left(left_after_s: float) -> Backend:
    """A backend whose P1 served 100 first tokens in 30 ms, and two of whose P1 clients
    (streams) left ``left_after_s`` after their request came, no token given."""
    backend = build_backend(realtime=False)
    backend.metrics.set_slo(SLO)
    for _ in range(100):
        backend.metrics.observe_ttft(Priority.P1, 0.03)

    async def leave() -> None:
        body = CompletionRequest(prompt="one two three", max_tokens=50, ignore_eos=True,
                                 stream=True)
        prep = prepare(backend, body, {}, arrival_time=ARRIVAL)
        streams = [RequestStream(c.request, _Aborts()) for c in prep.choices]
        delivery = Delivery(backend, prep, streams, lambda: ARRIVAL + left_after_s,
                            slo=backend.metrics.slo)
        await _leave(delivery, True)

    for _ in range(2):
        asyncio.run(leave())
    return backend


def _input_series(backend: Backend) -> list[dict[str, str]]:
    """The TTFT histogram and the counters of first tokens never given, as a scrape
    reads them, each growing by its value every 15 s (a steady rate)."""
    out = []
    text = backend.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{TTFT}_bucket" or s.name in (REFUSED, ABANDONED):
                own = {k: v for k, v in s.labels.items() if k != "model_name"}
                out.append({"series": s.name + labels(**own),
                            "values": f"0+{s.value:g}x20"})
    return out


def _p99(value: float) -> list[dict[str, Any]]:
    return [{"expr": 'slopilot:ttft_seconds:p99{priority_class="p1"}', "eval_time": "3m",
             "exp_samples": [{"labels": "slopilot:ttft_seconds:p99{" + ",".join(
                 f'{k}="{v}"' for k, v in ident(priority_class="p1").items()) + "}",
                 "value": value}]}]


@pytest.mark.prometheus
def test_clients_gone_within_the_target_leave_the_p99_to_the_served(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    backend = _served_and_left(0.017)
    assert backend.metrics.abandoned()[Priority.P1] == 2  # still counted, as they left
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "strict"})]
    edge = next(e for e in TOKEN_LATENCY_BUCKETS if e >= 0.03)
    no_alert: list[dict[str, Any]] = [{"eval_time": "4m", "alertname": name, "exp_alerts": []}
                for name in ("SlopilotTTFTP99High", "SlopilotTTFTP99Sustained")]
    # Rank 99 of 100 within the bucket ending at the edge over 30 ms.
    low = max(e for e in TOKEN_LATENCY_BUCKETS if e < 0.03)
    run(prometheus_binaries, tmp_path, files, _input_series(backend), no_alert,
        _p99(low + (edge - low) * 0.99))


@pytest.mark.prometheus
def test_clients_gone_after_waiting_past_the_target_keep_the_p99_over_it(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    backend = _served_and_left(0.6)
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "strict"})]
    # 2 of 102 never given a first token: the P99 is among them, the top finite edge.
    run(prometheus_binaries, tmp_path, files, _input_series(backend), [],
        _p99(TOKEN_LATENCY_BUCKETS[-1]))
