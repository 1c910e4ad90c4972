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

import json
import re
import socket
import time

import httpx
import pytest

from tests.support.held_loop import (
    HAS_TCP_INFO,
    TICK_S,
    streamed_after_a_hold,
    wait_in_the_kernel,
)
from tests.support.live_server import start_server
from tests.support.waits import HANG_GUARD_S

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


@pytest.mark.parametrize("request_bytes", [pytest.param(_completion(), id="content-length"),
                                           pytest.param(_chunked_completion(), id="chunked")])
def test_a_request_whose_body_trickles_in_counts_its_ttft_from_its_last_byte(
        request_bytes: bytes) -> None:
    """The reviewer's slow client: the head and 10 bytes of the body, its upload paused
    (HELD_MS by the kernel's clock), then the rest."""
    cut = request_bytes.index(b"\r\n\r\n") + 4 + 10
    with start_server() as srv, \
            socket.create_connection(("127.0.0.1", srv.server.bound_port)) as sock:
        sock.settimeout(HANG_GUARD_S)
        sock.sendall(request_bytes[:cut])
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
    # Its last byte reached the kernel after ``sent`` (the kernel's reading within a
    # tick), and its first token came before the scrape that counted it: the upload's
    # pause, before ``sent``, is not in it.
    assert total <= scraped - sent + TICK_S, \
        f"TTFT {total:.3f} s, {scraped - sent:.3f} s from the last byte sent to the scrape"
