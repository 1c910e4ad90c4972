"""Through HTTP: a full queue of batch (P2) requests no longer locks realtime (P0) out.

The review's repro: P2 clients retrying their 429s kept ``max_waiting`` full, every P0
got 429 and counted a P0 miss. Now the newest P2 that has not started gives way: its
client gets the 429 (with Retry-After; a stream too, whose status waits for its first
token), counted as a P2 refusal, and the P0 is served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from tests.engine.server.test_errors import read_first_chunk
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

SLO = SLOSpec.from_profile("standard")
P2_SLO = SLO.class_slo(Priority.P2)
NONE = {Priority.P0: 0, Priority.P1: 0, Priority.P2: 0}


@contextlib.asynccontextmanager
async def _one_running_p2() -> AsyncIterator[tuple[LiveServer, httpx.AsyncClient]]:
    """A server of one seq slot and one waiting place, its slot held by a long P2 stream."""
    backend = build_backend(knobs={"max_num_seqs": 1, "max_waiting": 1})
    backend.metrics.set_slo(SLO)
    srv = start_server(backend)
    try:
        long = {"prompt": "a b c", "max_tokens": 5000, "stream": True, "ignore_eos": True,
                "priority": "p2"}
        async with httpx.AsyncClient(timeout=HANG_GUARD_S) as client:
            started = asyncio.Event()
            running = asyncio.create_task(
                read_first_chunk(client, srv.url + "/v1/completions", long, started))
            await asyncio.wait_for(started.wait(), HANG_GUARD_S)
            try:
                yield srv, client
            finally:
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
        await asyncio.to_thread(wait_for, lambda: srv.call(
            lambda e: not e.scheduler.requests), what="every request ended")
    finally:
        srv.stop()


def _series(text: str, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for k, v in sorted(s.labels.items()) if k != "model_name"): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


@pytest.mark.parametrize(("stream", "retry"), [(False, False), (True, False), (False, True)],
                         ids=["body", "stream", "retry"])
async def test_a_p0_takes_the_place_of_a_queued_p2_whose_client_gets_429(
        stream: bool, retry: bool) -> None:
    async with _one_running_p2() as (srv, client):
        url = srv.url + "/v1/completions"
        headers = {"x-stainless-retry-count": "1"} if retry else {}
        queued = asyncio.create_task(client.post(url, headers=headers, json={
            "prompt": "x y", "max_tokens": 4, "priority": "p2", "stream": stream}))
        await asyncio.to_thread(wait_for, lambda: srv.call(
            lambda e: e.scheduler.num_waiting) == 1, what="the P2 waiting")
        # The queue is full (max_waiting=1): before, this P0 got 429 and counted a P0 miss.
        urgent = await client.post(url, json={"prompt": "hi", "max_tokens": 2,
                                              "priority": "p0"})
        assert urgent.status_code == 200, urgent.text
        res = await queued
        assert res.status_code == 429, res.text
        err = res.json()["error"]
        assert err["code"] == "queue_full" and "gave way to a more urgent p0" in err["message"]
        assert 1 <= int(res.headers["retry-after"]) <= 60
        metrics = srv.backend.metrics
        text = (await client.get(srv.url + "/metrics")).text
        # A refusal of its own class, as one at the door: P2's, a P2 miss with no tokens
        # (a retry apart, as any retry turned away), and never a finished request.
        refused_p2 = 0 if retry else 1
        assert metrics.refused() == {**NONE, Priority.P2: refused_p2}
        # Offered once each, displaced or not (a retry is its call's, counted before).
        assert metrics.arrived() == {Priority.P0: 1, Priority.P1: 0,
                                     Priority.P2: 1 + (0 if retry else 1)}
        assert _series(text, "slopilot_requests_refused_total")[("p2",)] == refused_p2
        assert metrics.retries(refused=True) == {**NONE, Priority.P2: int(retry)}
        assert metrics.retries(refused=False) == NONE
        p2_verdicts = {k: v for k, v in metrics.verdicts().items()
                       if k[0] is Priority.P2 and v != (0, 0)}
        assert p2_verdicts == ({} if retry else {(Priority.P2, P2_SLO.label, False): (1, 0)})
        assert _series(text, "vllm:request_success_total")[("abort",)] == 0
        assert _series(text, "vllm:e2e_request_latency_seconds_count")[("p2",)] == 0


async def test_a_p2_newcomer_displaces_no_p2_and_is_refused_itself() -> None:
    async with _one_running_p2() as (srv, client):
        url = srv.url + "/v1/completions"
        queued = asyncio.create_task(client.post(url, json={
            "prompt": "x y", "max_tokens": 4, "priority": "p2", "stream": True}))
        await asyncio.to_thread(wait_for, lambda: srv.call(
            lambda e: e.scheduler.num_waiting) == 1, what="the P2 waiting")
        late = await client.post(url, json={"prompt": "hi", "max_tokens": 2, "priority": 2})
        assert late.status_code == 429
        assert "the waiting queue is full: 1 request waits" in late.json()["error"]["message"]
        assert srv.backend.metrics.refused() == {**NONE, Priority.P2: 1}
        # Offered, each: the running and the queued P2, and the one turned away at the
        # door (the workload probe bins this counter to read the load's bursts).
        assert srv.backend.metrics.arrived() == {**NONE, Priority.P2: 3}
        text = (await client.get(srv.url + "/metrics")).text
        assert _series(text, "slopilot_requests_arrived_total") == {
            ("p0",): 0, ("p1",): 0, ("p2",): 3}
        # First come, first served within a class: the queued one is still there.
        assert srv.call(lambda e: e.scheduler.num_waiting) == 1
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
