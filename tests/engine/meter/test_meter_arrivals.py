"""The meter counts each request for generation as it arrives (``ARRIVALS``).

vLLM drops a request whose client gave up (a disconnect, a client's timeout) from every
series it observes at the finish, and from its running and waiting gauges once aborted
(v0.11, ``v1/engine/output_processor.py:325-334``: ``OutputProcessor.abort_requests``
drops the request's state before any finish is recorded): on vLLM, finished requests
plus the queue's growth read the load its clients gave up on as never offered, in the
overload the loop acts on. The meter sees every request go by; the workload probe reads its count.

A request vLLM refuses as invalid (400 or 422: a prompt past the model's context, a
bad parameter; 404: no such model; 413) it never serves, and a client that retries one
in a loop is answered in milliseconds: no load. The meter counts it at its arrival as
any (its status comes only with a body's end), and once more when the engine's status
says so (``INVALID``); the probe takes those off."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.request_plan import RequestPlanner
from slopilot.engine.request import Priority
from tests.engine.meter.test_client_latency import exposition
from tests.engine.meter.test_meter import (
    DONE,
    HOLD,
    LABEL,
    STREAM,
    Client,
    Upstream,
    counted,
    event,
    give_up,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

ARRIVALS = "slopilot_meter_arrivals_total"
"""As Prometheus stores it: the name the workload probe reads."""
INVALID = "slopilot_meter_invalid_total"
"""Of those, the ones the engine refused as invalid: the probe takes them off."""
P0 = (("model_name", "llama"), ("priority_class", "p0"))


def arrivals(body: bytes, name: str = ARRIVALS) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of counter ``name`` (the arrivals by default) in a /metrics answer, by
    their labels."""
    return {tuple(sorted(s.labels.items())): s.value
            for s in exposition(body)[name.removesuffix("_total")].samples if s.name == name}


def test_each_request_for_generation_is_counted_as_it_arrives(tmp_path: Path) -> None:
    """A stream whose client gave up before its first token (the one vLLM counts nowhere),
    a stream served to its end, a body, a batch of two prompts with two choices each (four
    requests in vLLM's series), an answer vLLM refused, and a Responses stream: each
    request vLLM was asked for, counted under the meter's class and the model its
    streams named. What is not a request for generation (a listing of models, a scrape,
    a body the meter refused, one that is no JSON object) is not."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=1 << 16)
    upstream.answer([HOLD])  # the client leaves before any token
    upstream.answer([event(text="a", finish="stop"), DONE])
    upstream.answer([b'{"choices": []}'], headers={"content-type": "application/json"})
    upstream.answer([b'{"choices": []}'], headers={"content-type": "application/json"})
    upstream.answer([b'{"error": {"message": "busy"}}'], status=429,
                    headers={"content-type": "application/json"})
    upstream.answer([b"{}"], headers={"content-type": "application/json"})
    upstream.answer([b'{"data": []}'], headers={"content-type": "application/json"})
    upstream.answer([b'{"error": {"message": "bad"}}'], status=400,
                    headers={"content-type": "application/json"})

    async def go() -> bytes:
        gone = Client(meter, now)
        task = asyncio.ensure_future(gone.request("POST", "/v1/completions", STREAM))
        await give_up(gone, upstream, now, after=0)
        await asyncio.wait_for(task, HANG_GUARD_S)
        client = Client(meter, now)
        await client.request("POST", "/v1/completions", STREAM, written_at=[0.9, 0.9])
        await client.request("POST", "/v1/chat/completions",
                             {"model": "llama", "messages": []})
        await client.request("POST", "/v1/completions",
                             {"model": "llama", "prompt": ["a", "b"], "n": 2})
        await client.request("POST", "/v1/completions", STREAM)
        await client.request("POST", "/v1/responses", {"model": "llama", "input": "hi"})
        await client.request("GET", "/v1/models")
        await client.request("POST", "/v1/completions", raw=b"[1, 2]")
        await client.request("POST", "/v1/completions", raw=b"x" * (1 << 17))
        return (await client.request("GET", "/metrics"))[2]

    assert arrivals(run(go)) == {P0: 1 + 1 + 1 + 4 + 1 + 1}


def _error(upstream: Upstream, status: int) -> None:
    """The next request is answered ``status`` with an error body, as vLLM answers one."""
    upstream.answer([b'{"error": {"message": "x"}}'], status=status,
                    headers={"content-type": "application/json"})


def test_a_request_the_engine_refused_as_invalid_is_counted_again_as_invalid(
        tmp_path: Path) -> None:
    """Each answered with a client's error other than 429 is counted in ``INVALID`` as
    many times as it arrived: a stream whose prompt is past the context (400, as vLLM
    answers a stream it will not start), a batch of two prompts with two choices each
    (400: four), a chat with a bad parameter (422), a Responses request for a model not
    served (404), one the engine found too large (413). Turned away for load (429), failed
    by the engine (500, 503), or served: load, arrivals only. A listing of models answered
    404 was no request for generation: neither."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    for status in (400, 400, 422, 404, 413, 429, 500, 503):
        _error(upstream, status)
    upstream.answer([event(text="a", finish="stop"), DONE])
    _error(upstream, 404)

    async def go() -> bytes:
        client = Client(meter, now)
        await client.request("POST", "/v1/completions", {**STREAM, "prompt": "x" * 64})
        await client.request("POST", "/v1/completions",
                             {"model": "llama", "prompt": ["a", "b"], "n": 2})
        await client.request("POST", "/v1/chat/completions",
                             {"model": "llama", "messages": [], "temperature": -1})
        await client.request("POST", "/v1/responses", {"model": "other", "input": "hi"})
        await client.request("POST", "/v1/completions", {"model": "llama", "prompt": "y"})
        for _ in range(3):
            await client.request("POST", "/v1/completions", STREAM)
        await client.request("POST", "/v1/completions", STREAM, written_at=[0.9, 0.9])
        await client.request("GET", "/v1/models")
        return (await client.request("GET", "/metrics"))[2]

    body = run(go)
    assert arrivals(body) == {P0: 1 + 4 + 1 + 1 + 1 + 3 + 1}
    assert arrivals(body, INVALID) == {P0: 1 + 4 + 1 + 1 + 1}


def test_a_client_gone_before_the_engines_status_stays_an_arrival(tmp_path: Path) -> None:
    """The case the count is for: a client that left before the engine answered (vLLM
    answers a body only once generated) is an arrival, whatever the engine would have
    answered; nothing is known of it to take it off."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    _never_answered(meter, upstream)

    async def go() -> bytes:
        await _leave_before_any_status(meter, upstream, now, {"model": "llama", "prompt": "x"},
                                       at=0.0)
        return (await Client(meter, now).request("GET", "/metrics"))[2]

    body = run(go)
    assert arrivals(body) == {(("model_name", ""), ("priority_class", "p0")): 1.0}
    assert arrivals(body, INVALID) == {(("model_name", ""), ("priority_class", "p0")): 0.0}


def test_the_counts_are_exported_from_the_start(tmp_path: Path) -> None:
    """Both at 0 before any request, so a replica's first window reads its first arrivals
    (``increase()`` counts nothing of a series' first sample), and the probe tells a
    metered replica that saw none from one without the meter."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)

    async def go() -> bytes:
        return (await Client(meter, now).request("GET", "/metrics"))[2]

    body = run(go)
    for name in (ARRIVALS, INVALID):
        assert arrivals(body, name) == {(("model_name", ""), ("priority_class", "p0")): 0.0}


def _never_answered(meter: Meter, upstream: Upstream) -> None:
    """The engine takes each request for generation and answers none (no status)."""
    async def generating(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return await upstream.handle(request)
        upstream.requests.append(request)
        await asyncio.Event().wait()
        raise AssertionError("never answered")
    meter.client = httpx.AsyncClient(transport=httpx.MockTransport(generating))


async def _leave_before_any_status(meter: Meter, upstream: Upstream, now: list[float],
                                   body: dict[str, Any], at: float) -> None:
    """``body`` sent to /v1/completions, its client gone at ``at`` with no status."""
    gone, sent, asked = asyncio.Event(), [], len(upstream.requests)
    messages = [{"type": "http.request", "more_body": False,
                 "body": json.dumps(body).encode()}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)
    task = asyncio.ensure_future(meter(
        {"type": "http", "method": "POST", "path": "/v1/completions",
         "raw_path": b"/v1/completions", "query_string": b"", "headers": []},
        receive, send))
    while len(upstream.requests) == asked:
        await asyncio.sleep(0)
    now[0] = at
    gone.set()
    await asyncio.wait_for(task, HANG_GUARD_S)
    assert sent == []


BATCH = {"model": "llama", "prompt": ["a"] * 4000, "n": 128, "stream": True}
"""512,000 requests in vLLM's series once it takes them, from a body of 16 KB."""


def test_a_batchs_other_prompts_arrive_once_the_engine_answered(tmp_path: Path) -> None:
    """vLLM runs each prompt of a batch times its ``n`` as a request of its own, counted
    so in its series, once it took the batch. A client that left before any status
    proved no such thing: counted at once, a body of a few KB read as 512,000 arrivals
    (2,560,001 from 80 KB; 20,000 prompts), which nothing took back, and as many verdicts
    judged an object each (a 160 KB body held the loop 27 s and took 1.35 GB). Before
    the engine's status a batch counts its first prompt's choices (what one prompt's
    ``n`` can make), in arrivals and in the verdicts of a stream cut short; the rest come
    with the status. Judged, the choices that never came are one verdict of their count."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    _never_answered(meter, upstream)
    missed = (Priority.P0, LABEL, False)
    tracemalloc.start()
    try:
        run(lambda: _leave_before_any_status(meter, upstream, now, BATCH, at=0.8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (meter.arrivals, meter.invalid) == (128, 0)
    assert counted(meter) == {missed: (128, 0)}
    assert peak < 8 << 20

    answered = meter_for(tmp_path, upstream, now)
    upstream.answer([HOLD])

    async def go() -> None:
        client = Client(answered, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions", BATCH))
        await give_up(client, upstream, now, after=0)
        await asyncio.wait_for(task, HANG_GUARD_S)

    now[0] = 0.0
    tracemalloc.start()
    try:
        run(go)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (answered.arrivals, answered.invalid) == (512_000, 0)
    assert counted(answered) == {missed: (512_000, 0)}
    assert peak < 8 << 20


def test_n_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM v0.11 serves any ``n`` of at least 1 (``SamplingParams._verify_args``
    refuses only one below; ``AsyncLLM.add_request`` fans it out into that many child
    requests, each one in its series). The meter read one above 16,384 (a bound of later
    vLLMs, ``VLLM_MAX_N_SEQUENCES``) as a single choice: 16,384 arrivals and, cut short,
    as many missed verdicts gone. Below 1 vLLM answers 400: one arrival, taken off as
    invalid."""
    upstream, now = Upstream(), [0.0]
    planner: RequestPlanner = meter_for(tmp_path, upstream, now).planner

    def planned(n: Any) -> tuple[int, int, int]:
        body = json.dumps({"model": "llama", "prompt": "a", "n": n, "stream": True}).encode()
        plan = run(lambda: planner.plan("POST", "/v1/completions", body, 0.0))
        assert plan.judge is not None
        return plan.arrivals, plan.at_once, plan.judge.n

    assert planned(1000) == (1000, 1000, 1000)
    assert planned(16_385) == (16_385, 16_385, 16_385)
    assert planned("100000") == (100_000, 100_000, 100_000)
    assert planned(0) == planned(-3) == (1, 1, 1)
