"""The meter's count of the requests for generation in flight (``IN_FLIGHT``).

vLLM may keep its running and waiting gauges from its last step once every request was
aborted (vllm-project/vllm#22545, #29928): an idle pod read as busy, with no token made,
and the stall alert paged and held the loop. The meter sees each request it forwarded
end, whichever way: the stall rule reads its count beside vLLM's gauges. Each test holds
a request open, reads the gauge from a scrape (the scrape itself no request for
generation), ends it one way, and reads it back at 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.meter.exposition import IN_FLIGHT
from slopilot.engine.meter.proxy import Meter
from tests.engine.meter.test_client_latency import exposition
from tests.engine.meter.test_meter import (
    DONE,
    HOLD,
    STREAM,
    VLLM_METRICS,
    Client,
    Upstream,
    event,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

BODY = {"model": "llama", "prompt": "hi", "max_tokens": 4}


def vllm_metrics() -> httpx.Response:
    return httpx.Response(200, content=VLLM_METRICS,
                          headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})


async def in_flight(meter: Meter, now: list[float]) -> float:
    """The gauge as a scrape of the meter reads it."""
    _, _, body = await Client(meter, now).request("GET", "/metrics")
    samples = exposition(body)[IN_FLIGHT].samples
    assert [s.labels["priority_class"] for s in samples] == ["p0"]
    return float(samples[0].value)


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)
    await asyncio.wait_for(poll(), HANG_GUARD_S)


def held_then(tmp_path: Path, end: Callable[[Client, Upstream, asyncio.Task[Any]],
                                             Coroutine[Any, Any, None]],
              answer: list[bytes] | None = None) -> tuple[float, float]:
    """The gauge while one stream is held open at the engine, and after ``end`` ended it."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer(answer if answer is not None else [event(text="a"), HOLD])

    async def go() -> tuple[float, float]:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", STREAM))
        await until(lambda: bool(upstream.requests))
        during = await in_flight(meter, now)
        await end(client, upstream, task)
        return during, await in_flight(meter, now)

    result: tuple[float, float] = run(go)
    return result


def test_a_stream_is_in_flight_until_its_client_leaves(tmp_path: Path) -> None:
    async def leave(client: Client, upstream: Upstream, task: asyncio.Task[Any]) -> None:
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)

    assert held_then(tmp_path, leave) == (1, 0)


def test_a_stream_is_in_flight_until_it_is_answered_in_full(tmp_path: Path) -> None:
    async def finish(client: Client, upstream: Upstream, task: asyncio.Task[Any]) -> None:
        upstream.hold.set()
        await asyncio.wait_for(task, HANG_GUARD_S)

    assert held_then(tmp_path, finish, [event(text="a", finish="stop"), DONE, HOLD]) == (1, 0)


def test_a_request_whose_server_cancels_it_leaves_the_count(tmp_path: Path) -> None:
    async def cancel(client: Client, upstream: Upstream, task: asyncio.Task[Any]) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert held_then(tmp_path, cancel) == (1, 0)


def test_a_stream_the_engine_breaks_off_leaves_the_count(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    broken = asyncio.Event()

    async def broken_body() -> AsyncIterator[bytes]:
        yield event(text="a")
        await broken.wait()
        raise httpx.ReadError("connection reset by peer")

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return vllm_metrics()
        upstream.requests.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=broken_body())
    meter.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))

    async def go() -> tuple[float, float]:
        task = asyncio.ensure_future(Client(meter, now).request("POST", "/v1/completions",
                                                                STREAM))
        await until(lambda: bool(upstream.requests))
        during = await in_flight(meter, now)
        broken.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        return during, await in_flight(meter, now)

    assert run(go) == (1, 0)


def test_requests_the_engine_answered_refused_or_never_took_leave_the_count(
        tmp_path: Path) -> None:
    """A body answered, one refused as invalid, and one the engine never answered (502):
    none left in flight. Neither a listing of models nor a scrape was one."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([b'{"choices": []}'], headers={"content-type": "application/json"})
    upstream.answer([b'{"error": {"message": "bad"}}'], status=400,
                    headers={"content-type": "application/json"})
    upstream.answer([b'{"data": []}'], headers={"content-type": "application/json"})

    async def go() -> float:
        client = Client(meter, now)
        await client.request("POST", "/v1/completions", BODY)
        await client.request("POST", "/v1/completions", BODY)
        await client.request("GET", "/v1/models")
        return await in_flight(meter, now)

    assert run(go) == 0

    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return vllm_metrics()
        raise httpx.ConnectError("refused", request=request)
    meter.client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))

    async def go_down() -> tuple[int, float]:
        status, _, _ = await Client(meter, now).request("POST", "/v1/completions", STREAM)
        return status, await in_flight(meter, now)

    assert run(go_down) == (502, 0)


def test_streams_held_at_once_are_each_in_flight(tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    for _ in range(3):
        upstream.answer([event(text="a"), HOLD])

    async def go() -> tuple[float, float]:
        clients = [Client(meter, now) for _ in range(3)]
        tasks = [asyncio.ensure_future(c.request("POST", "/v1/completions", STREAM))
                 for c in clients]
        await until(lambda: len(upstream.requests) == 3)
        during = await in_flight(meter, now)
        clients[0].leave.set()
        await asyncio.wait_for(tasks[0], HANG_GUARD_S)
        after_one = await in_flight(meter, now)
        for c in clients[1:]:
            c.leave.set()
        await asyncio.wait_for(asyncio.gather(*tasks[1:]), HANG_GUARD_S)
        return during, after_one

    assert run(go) == (3, 2)
