"""``slopilot serve`` counts TTFT from when a request's bytes reached its kernel: a
server whose loop was held up while a new connection waited in the accept queue, its
request with it, reports that wait in ``vllm:time_to_first_token_seconds`` as the client
paid it (``http_arrival``'s ``backdate``, on the engine's real clock).

A request whose body trickles in (a slow upload) counts TTFT from its last byte: the
client's upload is its own link's time, which no replica could shorten.

Live sockets; the waits are on what the kernel reports (``tests.support.held_loop``),
and the assertions bounds the kernel's own clock or the order of events set, not a speed.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable

import httpx
import pytest
from fastapi import Request

from slopilot.engine.server import openai_routes
from slopilot.engine.server.arrival import arrival_of
from tests.support.held_loop import (
    HAS_TCP_INFO,
    TICK_S,
    streamed_after_a_hold,
    wait_in_the_kernel,
)
from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S, wait_for

HELD_MS = 200

pytestmark = pytest.mark.skipif(not HAS_TCP_INFO, reason="TCP_INFO is Linux's")


BODY = json.dumps({"prompt": "hi", "max_tokens": 1, "stream": True}).encode()
HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


def _completion() -> bytes:
    return HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY


def _chunked_completion() -> bytes:
    return (HEAD + b"transfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:]))
            + b"0\r\n\r\n")


def _ttft(metrics: str) -> tuple[float, float]:
    """The TTFT histogram's sum and count, over its series."""
    sums = re.findall(r"^vllm:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", metrics, re.M)
    counts = re.findall(r"^vllm:time_to_first_token_seconds_count\{[^}]*\} (\S+)$",
                        metrics, re.M)
    return sum(map(float, sums)), sum(map(float, counts))


def test_a_request_held_in_the_accept_queue_counts_the_wait_in_its_ttft() -> None:
    with start_server() as srv:
        streamed_after_a_hold(srv.loop, srv.server.bound_port, _completion(), HELD_MS)
        metrics = httpx.get(srv.url + "/metrics", timeout=HANG_GUARD_S).text
    total, n = _ttft(metrics)
    assert n == 1
    # Its bytes waited HELD_MS in the kernel (within a tick of the client's reading and
    # one of the server's) before the server could read them.
    assert total >= HELD_MS / 1000 - 2 * TICK_S


def _head_stamped(srv: LiveServer) -> bool:
    """Whether the server's connection has parsed a request's head, and so stamped it
    with the time of the read that brought the head (asked on the server's loop, which
    alone changes its connections)."""
    async def ask() -> bool:
        return any(getattr(getattr(c, "timed", None), "request_arrival", 0.0) > 0.0
                   for c in srv.server.server_state.connections)
    return asyncio.run_coroutine_threadsafe(ask(), srv.loop).result(HANG_GUARD_S)


@pytest.mark.parametrize("request_bytes", [pytest.param(_completion(), id="content-length"),
                                           pytest.param(_chunked_completion(), id="chunked")])
def test_a_request_whose_body_trickles_in_counts_its_ttft_from_its_last_byte(
        request_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reviewer's slow client: the head and 10 bytes of the body, its upload paused
    (HELD_MS by the kernel's clock) once the server has read and stamped the head, then
    the rest.

    Decided on the request's own arrival, the one its TTFT counts from, against the
    test's clock: no later than the kernel got the rest (after ``sent``, within a tick),
    while a stamp of the first part's read (the bug) came HELD_MS before ``sent``,
    however slow the machine. Waiting for the server to have read the first part is what
    keeps a busy server, reading both parts at once, from hiding the bug."""
    arrivals: list[float] = []

    def recorded(request: Request, clock: Callable[[], float]) -> float:
        arrival = arrival_of(request, clock)
        arrivals.append(arrival)
        return arrival

    monkeypatch.setattr(openai_routes, "arrival_of", recorded)
    cut = request_bytes.index(b"\r\n\r\n") + 4 + 10
    with start_server() as srv, \
            socket.create_connection(("127.0.0.1", srv.server.bound_port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(request_bytes[:cut])
        wait_for(lambda: _head_stamped(srv), what="the server to read the request's head")
        wait_in_the_kernel(sock, HELD_MS)
        sent = time.monotonic()
        sock.sendall(request_bytes[cut:])
        answer = b""
        while b"data: [DONE]" not in answer:
            got = sock.recv(65536)
            assert got, f"the connection closed after {answer!r}"
            answer += got
        metrics = httpx.get(srv.url + "/metrics", timeout=HANG_GUARD_S).text
        scraped = time.monotonic()
    total, n = _ttft(metrics)
    assert n == 1
    assert len(arrivals) == 1, f"arrivals {arrivals}"
    # The server's clock is the test's (real time, backdated by the kernel's reading,
    # within a tick): the first part's stamp would be HELD_MS - 2 ticks before ``sent``.
    assert arrivals[0] >= sent - TICK_S, \
        (f"the request counted as arrived {sent - arrivals[0]:.3f} s before its last "
         f"bytes were sent, its upload's pause counted in its TTFT")
    # And its TTFT counts from that arrival: its first token came before the scrape.
    assert total <= scraped - arrivals[0], \
        f"TTFT {total:.3f} s, {scraped - arrivals[0]:.3f} s from its arrival to the scrape"
