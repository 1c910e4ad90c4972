"""A request the drain ends before it started is answered 503, as one refused at the door.

A drain past its timeout aborted every request still held, started or not. One still
queued (no choice had a token) got HTTP 200 with empty text and finish_reason "abort",
stream or body: an OpenAI SDK reads that as a success and does not retry, where the
server promises 503 while draining so the client retries on another replica. A
stream's status waits for its first output (``Delivery.started``) so such a request
can still be told; a request that had started ends as cut short, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from tests.support.live_server import build_backend, start_server
from tests.support.stalled_client import EngineFreeze
from tests.support.waits import HANG_GUARD_S, wait_for

_RUNNING = {"prompt": "a b c", "max_tokens": 5000, "stream": True, "ignore_eos": True,
            "priority": "p2"}


async def _read(client: httpx.AsyncClient, url: str, started: asyncio.Event) -> list[str]:
    lines = []
    async with client.stream("POST", url, json=_RUNNING) as res:
        async for line in res.aiter_lines():
            started.set()
            lines.append(line)
    return lines


def _no_counts() -> dict[Priority, int]:
    return {p: 0 for p in Priority}


async def test_a_request_still_queued_when_the_drain_times_out_is_answered_503() -> None:
    backend = build_backend(knobs={"max_num_seqs": 1, "max_waiting": 2})
    backend.metrics.set_slo(SLOSpec.from_profile("standard"))
    srv = start_server(backend, drain_timeout_s=0.2)
    url = srv.url + "/v1/completions"
    queued: dict[str, Any] = {"prompt": "x y", "max_tokens": 4, "priority": "p1"}
    try:
        async with httpx.AsyncClient(timeout=HANG_GUARD_S) as client:
            started = asyncio.Event()
            running = asyncio.create_task(_read(client, url, started))
            await started.wait()
            stream = asyncio.create_task(client.post(url, json={**queued, "stream": True}))
            body = asyncio.create_task(client.post(url, json=queued))
            await asyncio.to_thread(wait_for, lambda: srv.call(
                lambda e: e.scheduler.num_waiting) == 2, what="both requests queued")
            # The drain's 0.2 s end waits for the engine, held here until the door has
            # answered: past it the server exits, and a door request a busy machine sent
            # late found nothing listening.
            freeze = EngineFreeze(srv)
            await asyncio.to_thread(freeze.hold)
            try:
                srv.begin_drain()
                door = await client.post(url, json=queued)  # refused while draining
            finally:
                freeze.thaw()
            answers = [await stream, await body]
            lines = await running
    finally:
        srv.stop()
    assert door.status_code == 503
    for res in answers:
        assert res.status_code == 503, res.text
        assert res.json() == door.json()
        assert res.json()["error"]["code"] == "draining"
        assert res.headers.get("retry-after") == door.headers.get("retry-after")
    # The one that had started ends as cut short, in its 200 stream.
    assert '"finish_reason":"abort"' in [x for x in lines if x.startswith("data: {")][-1]
    # Told to retry elsewhere, as at the door: neither abandoned nor refused for load.
    assert backend.metrics.abandoned() == _no_counts()
    assert backend.metrics.refused() == _no_counts()
