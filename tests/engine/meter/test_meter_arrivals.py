"""The meter counts each request for generation as it arrives (``ARRIVALS``).

vLLM drops a request whose client gave up (a disconnect, a client's timeout) from every
series it observes at the finish, and from its running and waiting gauges once aborted
(0.34, ``v1/engine/output_processor.py``): on vLLM, finished requests plus the queue's
growth read the load its clients gave up on as never offered, in the overload the loop
acts on. The meter sees every request go by; the workload probe reads its count."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.engine.meter.test_client_latency import exposition
from tests.engine.meter.test_meter import (
    DONE,
    HOLD,
    STREAM,
    Client,
    Upstream,
    event,
    give_up,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

ARRIVALS = "slopilot_meter_arrivals_total"
"""As Prometheus stores it: the name the workload probe reads."""
BASE = ARRIVALS.removesuffix("_total")


def arrivals(body: bytes) -> dict[tuple[tuple[str, str], ...], float]:
    """The arrival counter's samples in a /metrics answer, by their labels."""
    return {tuple(sorted(s.labels.items())): s.value
            for s in exposition(body)[BASE].samples if s.name == ARRIVALS}


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

    assert arrivals(run(go)) == {
        (("model_name", "llama"), ("priority_class", "p0")): 1 + 1 + 1 + 4 + 1 + 1}


def test_the_count_is_exported_from_the_start(tmp_path: Path) -> None:
    """At 0 before any request, so a replica's first window reads its first arrivals
    (``increase()`` counts nothing of a series' first sample), and the probe tells a
    metered replica that saw none from one without the meter."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)

    async def go() -> bytes:
        return (await Client(meter, now).request("GET", "/metrics"))[2]

    assert arrivals(run(go)) == {(("model_name", ""), ("priority_class", "p0")): 0.0}
