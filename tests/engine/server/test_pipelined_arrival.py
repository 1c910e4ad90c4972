"""HTTP/1.1 pipelining into ``slopilot serve``: two streamed completions sent back to back
on one connection are answered one after the other, so the second's client waits for the
whole first answer before its first token. That wait is TTFT the client pays, and the
server's TTFT counts it: the second request is stamped when its bytes came in, not when
uvicorn got round to calling the app for it.

Live sockets, but no speed in the assertions: the engine's clock is the test's, and the
engine runs nothing until the test has moved it.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from typing import Any

import httpx

from slopilot.engine.engine import WallClock
from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput
from slopilot.engine.server.uvicorn_runner import make_server, run_in_thread
from tests.support.live_server import LiveServer, build_backend
from tests.support.read_counting import counting
from tests.support.waits import HANG_GUARD_S, wait_for


class _GatedExecutor:
    """The simulated executor, running no iteration until the test lets it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.go = threading.Event()

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.entered.set()
        self.go.wait(HANG_GUARD_S)
        result: ModelRunnerOutput = self.inner.execute(out)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)



def _completion(priority: str) -> bytes:
    body = json.dumps({"prompt": "hi", "max_tokens": 4, "stream": True, "ignore_eos": True,
                       "priority": priority}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body)


def _ttft_sum(metrics: str, priority: str) -> float:
    return sum(float(v) for v in re.findall(
        rf'^vllm:time_to_first_token_seconds_sum{{[^}}]*priority_class="{priority}"[^}}]*}} '
        r'(\S+)$', metrics, re.M))


def test_a_pipelined_requests_ttft_counts_its_wait_behind_the_one_before() -> None:
    now = [100.0]  # not 0: the engine reads an arrival of 0.0 as "not stamped yet"
    backend = build_backend(realtime=False)
    backend.engine.clock = WallClock(lambda: now[0])
    gate = _GatedExecutor(backend.engine.executor)
    backend.engine.executor = gate  # type: ignore[assignment]
    server = make_server(backend, port=0, drain_timeout_s=5.0, check_integrity=True)
    read: list[int] = []
    server.config.http = counting(server.config.http, read)  # type: ignore[arg-type]
    with LiveServer(f"http://127.0.0.1:{server.bound_port}", server, run_in_thread(server),
                    backend) as srv:
        # The first in class p0, the second in p2: each has a TTFT series of its own.
        sent = _completion("p0") + _completion("p2")
        with socket.create_connection(("127.0.0.1", server.bound_port)) as sock:
            sock.settimeout(HANG_GUARD_S)
            sock.sendall(sent)
            wait_for(lambda: sum(read) == len(sent) and gate.entered.is_set(),
                     what="the server to read both requests and the engine to take the first")
            now[0] = 110.0  # the first answer's 10 s, during which the second waits its turn
            gate.go.set()
            answers = b""
            while answers.count(b"data: [DONE]") < 2:
                got = sock.recv(65536)
                assert got, f"the connection closed after {answers!r}"
                answers += got
        assert answers.count(b"HTTP/1.1 200") == 2
        metrics = httpx.get(srv.url + "/metrics", timeout=HANG_GUARD_S).text
    assert _ttft_sum(metrics, "p0") == 10.0
    # Its bytes came at 100 with the first's; its first token was written at 110.
    assert _ttft_sum(metrics, "p2") == 10.0
