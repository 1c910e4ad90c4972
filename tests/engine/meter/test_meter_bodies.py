"""The request bodies the meter holds: one at most ``max_body_bytes``, refused before it is
read where its length says so; all of them at once at most ``body_budget_bytes`` (the
first of them always read on); each read for the few fields the meter needs, in steps,
none of its prompts made; and let go once it is sent on.

The meter runs in 256 MiB beside vLLM. Bodies up to 64 MiB were held whole for as long
as their streams ran, and parsed whole by ``json.loads`` (on a thread, holding the GIL
all the same): an 8 MiB body of one-token prompts took 320-580 MB, and stalled every
other stream for 1.3 s.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx

from slopilot.engine.meter.request_plan import RequestPlanner
from tests.engine.meter.test_meter import (
    DONE,
    Client,
    Upstream,
    event,
    meter_for,
    run,
)
from tests.support.waits import HANG_GUARD_S

Message = MutableMapping[str, Any]


def _scope(path: str, headers: dict[str, str]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [(k.encode(), v.encode())
                                             for k, v in headers.items()]}


def test_a_body_declared_past_the_cap_is_refused_before_a_byte_of_it_is_read(
        tmp_path: Path) -> None:
    """Its Content-Length says it: a 413 that names the limit and the flag, the body never
    asked for (an ``Expect: 100-continue`` client never sends it)."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=100)
    reads, sent = [], []

    async def receive() -> Message:
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 101, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    run(lambda: meter(_scope("/v1/completions", {"content-length": "101"}), receive, send))
    assert reads == [] and upstream.requests == []
    assert sent[0]["status"] == 413
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "request_too_large"
    assert "101 bytes" in error["message"] and "at most 100 bytes" in error["message"]
    assert "--max-body-mb" in error["message"]


def _sized(size: int) -> bytes:
    """A completions request of exactly ``size`` bytes."""
    head = b'{"model": "llama", "prompt": "'
    return head + b"x" * (size - len(head) - 2) + b'"}'


def _receiver(pieces: list[tuple[bytes, asyncio.Event | None]], reads: list[int]
              ) -> Callable[[], Any]:
    """A client's side: each piece once its gate (if any) is set; ``reads`` counts the
    meter's asks."""
    async def receive() -> Message:
        reads.append(1)
        if pieces:
            piece, gate = pieces.pop(0)
            if gate is not None:
                await gate.wait()
            return {"type": "http.request", "body": piece, "more_body": bool(pieces)}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
    return receive


async def _ignore(message: Message) -> None:
    pass


def test_the_bodies_held_at_once_stay_within_the_budget(tmp_path: Path) -> None:
    """A body's next piece waits until the bodies held leave it room: one read to 70
    bytes of a budget of 100 holds a body after it at its first 40 bytes, unread on and
    unsent, until it was itself sent on. Without it, bodies within the cap made,
    together, the meter's memory (each counted as it comes, not as declared: a client
    that declares a large body and sends a byte a minute holds a byte)."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=100, body_budget_bytes=100)
    for _ in range(3):
        upstream.answer([b"{}"], headers={"content-type": "application/json"})
    first, second = _sized(90), _sized(60)
    rest = asyncio.Event()
    first_reads: list[int] = []
    second_reads: list[int] = []

    async def go() -> None:
        a = asyncio.ensure_future(meter(
            _scope("/v1/completions", {"content-length": "90"}),
            _receiver([(first[:70], None), (first[70:], rest)], first_reads), _ignore))
        while len(first_reads) < 2:  # 70 bytes read, the rest to come
            await asyncio.sleep(0)
        b = asyncio.ensure_future(meter(
            _scope("/v1/completions", {"content-length": "60"}),
            _receiver([(second[:40], None), (second[40:], None)], second_reads), _ignore))
        for _ in range(100):
            await asyncio.sleep(0)
        assert len(second_reads) == 1 and upstream.requests == []
        assert meter.budget.held == 70
        # A request with no body waits for no room (it waited behind the bodies).
        status, _, _ = await asyncio.wait_for(
            Client(meter, now).request("GET", "/v1/models"), HANG_GUARD_S)
        assert status == 200
        rest.set()
        await asyncio.wait_for(asyncio.gather(a, b), HANG_GUARD_S)

    run(go)
    assert [r.content for r in upstream.requests] == [b"", first, second]
    assert meter.budget.held == 0


def test_the_body_that_came_first_is_always_read_on(tmp_path: Path) -> None:
    """Two bodies read in part, the budget full: the first's next piece is taken past it
    (by one body at most), or each would wait for the other's room for ever."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=100, body_budget_bytes=100)
    for _ in range(2):
        upstream.answer([b"{}"], headers={"content-type": "application/json"})
    first, second = _sized(90), _sized(60)
    gate = asyncio.Event()
    first_reads: list[int] = []
    second_reads: list[int] = []

    async def go() -> None:
        a = asyncio.ensure_future(meter(
            _scope("/v1/completions", {"content-length": "90"}),
            _receiver([(first[:50], None), (first[50:], gate)], first_reads), _ignore))
        while len(first_reads) < 2:
            await asyncio.sleep(0)
        b = asyncio.ensure_future(meter(
            _scope("/v1/completions", {"content-length": "60"}),
            _receiver([(second[:40], None), (second[40:], None)], second_reads), _ignore))
        while len(second_reads) < 2:
            await asyncio.sleep(0)
        assert meter.budget.held == 90  # full, and both mid-body
        gate.set()
        await asyncio.wait_for(asyncio.gather(a, b), HANG_GUARD_S)

    run(go)
    assert [r.content for r in upstream.requests] == [first, second]
    assert meter.budget.held == 0


def _batch(prompts: int, **fields: Any) -> bytes:
    """A completions stream of ``prompts`` one-token prompts: 4 bytes of JSON each, some
    hundred bytes each as Python's objects."""
    head = json.dumps({"model": "llama", "stream": True, "max_tokens": 4, **fields},
                      separators=(",", ":")).encode()
    return head[:-1] + b',"prompt":[' + b",".join([b"[1]"] * prompts) + b"]}"


def test_a_large_body_is_read_for_its_fields_without_its_prompts_as_objects(
        tmp_path: Path) -> None:
    """2 MiB of one-token prompts: ``json.loads`` made them some 80 MB of lists and ints
    to count them (an 8 MiB body, 320-580 MB: the meter's limit is 256 MiB). The meter
    reads the few fields it needs and counts the prompts, holding no more than the body
    itself; the engine is asked for as many requests, and gets the client's bytes but for
    the stream options the meter asks for."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now, max_body_bytes=4 << 20)
    upstream.answer([event(text="a", finish="stop"), DONE])
    prompts = 2 << 20 >> 2
    body = _batch(prompts, n=2)

    async def go() -> int:
        status, _, _ = await Client(meter, now).request(
            "POST", "/v1/completions", raw=body, headers={"content-length": str(len(body))},
            written_at=[0.1, 0.1])
        return status

    tracemalloc.start()
    try:
        assert run(go) == 200
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(body)
    assert meter.arrivals == 2 * prompts
    forwarded = upstream.requests[0].content
    asked = b',"stream_options": {"include_usage": true, "continuous_usage_stats": true}}'
    assert forwarded == body[:-1] + asked


def test_a_client_s_stream_options_are_changed_in_place(tmp_path: Path) -> None:
    """The engine gets the client's bytes, its options member rewritten where it was (the
    last, where it wrote several: the one ``json.loads`` keeps), its own options kept."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])
    body = (b'{"model":"llama","stream_options":{"x":1},"stream":true,\n'
            b'"stream_options" : {"include_usage":true, "y": [2]} ,"prompt":"hi"}')

    async def go() -> None:
        await Client(meter, now).request("POST", "/v1/completions", raw=body,
                                         written_at=[0.1, 0.1])

    run(go)
    assert upstream.requests[0].content == (
        b'{"model":"llama","stream_options":{"x":1},"stream":true,\n'
        b'"stream_options": {"include_usage": true, "y": [2], '
        b'"continuous_usage_stats": true} ,"prompt":"hi"}')


class _Forgetful(httpx.AsyncBaseTransport):
    """An engine that reads each body to its end, keeps none of it, and answers a stream
    that stays open until ``hold`` is set."""

    def __init__(self) -> None:
        self.read, self.hold = 0, asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        async for chunk in request.stream:
            self.read += len(chunk)

        async def answer() -> Any:
            yield event(text="a")
            await self.hold.wait()
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=answer())


def test_a_body_sent_on_is_not_held_while_its_stream_runs(tmp_path: Path) -> None:
    """Once the engine has it, the meter keeps none of it: a stream runs for minutes, and
    its prompt's bytes, held to its end, counted against every body after it."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    engine = _Forgetful()
    meter.client = httpx.AsyncClient(transport=engine)
    body = _batch(1 << 18)
    pieces = [body[i:i + (64 << 10)] for i in range(0, len(body), 64 << 10)]
    sent: list[Message] = []
    held: list[int] = []

    async def receive() -> Message:
        if pieces:
            return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    async def go() -> None:
        task = asyncio.ensure_future(meter(
            _scope("/v1/completions", {"content-length": str(len(body))}), receive, send))
        while not any(m.get("body") for m in sent):
            await asyncio.sleep(0)
        held.append(tracemalloc.get_traced_memory()[0])
        engine.hold.set()
        await asyncio.wait_for(task, HANG_GUARD_S)

    tracemalloc.start()
    try:
        run(go)
    finally:
        tracemalloc.stop()
    assert engine.read > len(body)  # with the stream options the meter asks for
    assert held[0] < len(body) // 4


def test_a_large_body_is_read_in_steps_of_the_loop(tmp_path: Path) -> None:
    """The fields of a body are found 64 KiB at a time, the loop let run between two
    (parsed whole on a thread, ``json.loads`` held the GIL: a stream beside an 8 MiB body
    stalled 1.3 s). Counted in turns the loop gives another task while the body is read,
    not in time."""
    from slopilot.engine.meter.request_fields import STEP_BYTES

    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    planner: RequestPlanner = meter.planner
    body = _batch(1 << 20)
    turns = [0]

    async def go() -> None:
        done = asyncio.Event()

        async def beside() -> None:
            while not done.is_set():
                turns[0] += 1
                await asyncio.sleep(0)
        other = asyncio.ensure_future(beside())
        await asyncio.sleep(0)
        await planner.plan("POST", "/v1/completions", body, 0.0)
        done.set()
        await other

    run(go)
    assert turns[0] >= len(body) // STEP_BYTES


def test_an_upstream_that_breaks_off_before_any_status_counts_no_batch(
        tmp_path: Path) -> None:
    """An engine whose connection failed before it answered took nothing: a batch counts
    its first prompt's choices, as any request forwarded does."""
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)

    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("closed", request=request)
    meter.client = httpx.AsyncClient(transport=httpx.MockTransport(broken))

    async def go() -> int:
        status, _, _ = await Client(meter, now).request(
            "POST", "/v1/completions", raw=_batch(1000, n=8))
        return status

    assert run(go) == 502
    assert meter.arrivals == 8


FREED = r"""
import sys
from slopilot.engine.meter.body_budget import map_large_blocks
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
mapped = sys.argv[1] == "mapped" and map_large_blocks()
first = bytearray(b"x" * (16 << 20))
del first  # mapped, and freed: glibc raises its threshold past the bodies below
before = rss()
bodies = [bytearray(b"y" * (12 << 20)) for _ in range(3)]
del bodies[:2]  # the last, at the heap's top, kept
print(mapped, rss() - before)
"""


def test_a_body_freed_is_memory_given_back() -> None:
    """Bodies freed below one still held: kept in glibc's heap (its mapping threshold
    raised by a body freed before), they made the meter's RSS creep past what it held;
    mapped apart (``map_large_blocks``, as ``slopilot meter`` starts), each is given
    back. Counted in the bytes a fresh process keeps of two 12 MiB bodies freed."""
    import subprocess
    import sys

    from tests.docs.test_doc_references import ROOT

    kept = {}
    for how in ("mapped", "as glibc does"):
        out = subprocess.run([sys.executable, "-c", FREED, how], capture_output=True,
                             text=True, check=True, cwd=ROOT,
                             env={"PYTHONPATH": str(ROOT), "PATH": ""}).stdout.split()
        kept[how] = (out[0], int(out[1]))
    assert kept["mapped"][0] == "True"
    assert kept["mapped"][1] < 16 << 20 < kept["as glibc does"][1]
