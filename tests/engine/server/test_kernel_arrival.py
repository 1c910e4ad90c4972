"""``slopilot serve`` counts TTFT from when a request's bytes reached its kernel: a
server whose loop was held up while a new connection waited in the accept queue, its
request with it, reports that wait in ``vllm:time_to_first_token_seconds`` as the client
paid it (``http_arrival``'s ``backdate``, on the engine's real clock).

Live sockets; the waits are on what the kernel reports (``tests.support.held_loop``),
and the assertion a lower bound the kernel's own clock set, not a speed.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.support.held_loop import HAS_TCP_INFO, TICK_S, streamed_after_a_hold
from tests.support.live_server import start_server
from tests.support.waits import HANG_GUARD_S

HELD_MS = 200

pytestmark = pytest.mark.skipif(not HAS_TCP_INFO, reason="TCP_INFO is Linux's")


def _completion() -> bytes:
    body = json.dumps({"prompt": "hi", "max_tokens": 1, "stream": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body)


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
