"""What the send deadline costs a token stream: without it (``--send-timeout 0``) and with
it (the default 60 s), side by side in one run.

The deadline's code runs only when the transport pauses writing (``pause_writing`` arms
a timer, ``resume_writing`` cancels it); a send that does not pause runs uvicorn's code
alone. Measured three ways, the configurations alternating round by round (and which goes
first) so a busy machine slows both alike; each figure is the median over rounds:

- ``chunk_us``: uvicorn's h11 protocol with the server's mixins (arrival stamp and
  deadlines) streaming ``--chunks`` SSE-sized chunks (300 bytes) into a transport that
  takes them at once: the CPU a chunk costs on the event loop;
- ``paused_chunk_us``: the same into a transport that pauses writing past 64 KiB and
  whose client takes everything on the next turn of the loop: a timer armed and
  cancelled every ~220 chunks, a client as slow as it can be and still be served;
- ``serve``: ``slopilot serve``'s whole path (the simulated executor as fast as it goes,
  h11, the SSE responses) streaming ``--tokens`` tokens to a client in its own process
  reading a raw socket: tokens a second as that client got them (``serve_tok_s``), and
  the server's CPU a token (``serve_cpu_us_per_tok``: the engine's thread and the
  event loop's, this process's CPU time over the request).

CPU time, not wall time, where the machine may be shared: other processes slow the wall
clock of both configurations, by turns, far more than anything measured here.

    .venv/bin/python benchmarks/send_deadline_cost.py [--rounds 21] [--chunks 20000]
        [--tokens 8000]

Ends with ``RESULT chunk_us_off=... chunk_us_on=... chunk_us_ratio=...
paused_chunk_us_off=... paused_chunk_us_on=... paused_chunk_us_ratio=...
serve_tok_s_off=... serve_tok_s_on=... serve_tok_s_ratio=... serve_cpu_us_per_tok_off=...
serve_cpu_us_per_tok_on=... serve_cpu_us_per_tok_ratio=... pauses=...`` (a ratio: with
the deadline over without).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from slopilot.engine.config import EngineConfig
from slopilot.engine.http_arrival import h11_protocol
from slopilot.engine.http_deadlines import Deadlines, with_deadlines
from slopilot.engine.server.backends import build_simulated
from slopilot.engine.server.uvicorn_runner import DrainingServer, make_server, run_in_thread

OFF, ON = Deadlines(send_s=0.0), Deadlines()
CHUNK = b"data: " + b"x" * 292 + b"\n\n"  # a token's SSE chunk with a little text
HIGH_WATER = 64 * 1024  # asyncio's and uvloop's default
REQUEST = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
           b"content-length: 2\r\n\r\n{}")


class _Transport(asyncio.Transport):
    """Takes what is written at once, or (``pausing``) pauses writing past the high-water
    mark, its client taking everything on the loop's next turn."""

    def __init__(self, protocol: Any, pausing: bool) -> None:
        super().__init__()
        self.protocol, self.pausing = protocol, pausing
        self.buffered, self.paused, self.pauses = 0, False, 0
        self.closing = False

    def write(self, data: Any) -> None:
        if not self.pausing:
            return
        self.buffered += len(data)
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.pauses += 1
            self.protocol.pause_writing()
            asyncio.get_running_loop().call_soon(self._taken)

    def _taken(self) -> None:
        self.buffered, self.paused = 0, False
        self.protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000),
                "sockname": ("127.0.0.1", 8000)}.get(name, default)


def _app(chunks: int, done: asyncio.Event) -> Callable[..., Any]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(chunks):
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        done.set()
    return app


def protocol_us(deadlines: Deadlines, chunks: int, *, pausing: bool) -> tuple[float, int]:
    """Microseconds of the event loop a chunk, and how often writing paused."""
    async def main() -> tuple[float, int]:
        done = asyncio.Event()
        config = uvicorn.Config(_app(chunks, done), lifespan="off", log_config=None,
                                proxy_headers=False, access_log=False)
        config.load()
        cls: Any = with_deadlines(h11_protocol(time.monotonic), deadlines)
        protocol = cls(config, ServerState(), {}, _loop=asyncio.get_running_loop())
        transport = _Transport(protocol, pausing)
        protocol.connection_made(transport)
        start = time.process_time()
        protocol.data_received(REQUEST)
        await done.wait()
        elapsed = time.process_time() - start
        protocol.connection_lost(None)
        return elapsed / chunks * 1e6, transport.pauses

    return asyncio.run(main())


# The client: its own process, so its reading takes none of the server's CPU time. It
# streams one request for each line it reads (the server's name) and answers its rate.
CLIENT = r"""
import json, socket, sys, time
urls, tokens = json.loads(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"prompt": "hello", "max_tokens": tokens, "stream": True,
                   "ignore_eos": True}).encode()
head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body))
for line in sys.stdin:
    with socket.create_connection(tuple(urls[line.strip()])) as sock:
        start = time.perf_counter()
        sock.sendall(head + body)
        tail = b""
        while b"data: [DONE]" not in tail:
            got = sock.recv(1 << 20)
            if not got:
                raise SystemExit("the stream ended early")
            tail = (tail + got)[-64:]
    print(tokens / (time.perf_counter() - start), flush=True)
"""


def serve_runs(rounds: int, tokens: int) -> tuple[dict[str, list[float]],
                                                    dict[str, list[float]]]:
    """Through ``slopilot serve`` without and with the send deadline, per round: tokens a
    second as the client got them, and the server's CPU microseconds a token (this
    process: both servers' threads, the idle one waiting on a condition)."""
    servers: dict[str, DrainingServer] = {}
    for name, deadlines in (("off", OFF), ("on", ON)):
        backend = build_simulated(EngineConfig(), realtime=False)
        servers[name] = make_server(backend, deadlines=deadlines)
    threads = [run_in_thread(s) for s in servers.values()]
    urls = {name: ["127.0.0.1", s.bound_port] for name, s in servers.items()}
    client = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(urls), str(tokens)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    rate: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for i in range(rounds + 1):  # the first round warms both servers: not kept
            for name in ("off", "on") if i % 2 else ("on", "off"):
                start = time.process_time()
                client.stdin.write(name + "\n")
                client.stdin.flush()
                got = float(client.stdout.readline())
                if i:
                    rate[name].append(got)
                    cpu[name].append((time.process_time() - start) / tokens * 1e6)
        return rate, cpu
    finally:
        client.stdin.close()
        client.wait(60)
        for s in servers.values():
            s.should_exit = True
        for t in threads:
            t.join(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--chunks", type=int, default=20_000)
    ap.add_argument("--tokens", type=int, default=8000)
    args = ap.parse_args()

    plain: dict[str, list[float]] = {"off": [], "on": []}
    paused: dict[str, list[float]] = {"off": [], "on": []}
    pauses = 0
    protocol_us(ON, 1000, pausing=True)  # warm: imports, the first loop
    for i in range(args.rounds):
        order = [("off", OFF), ("on", ON)]
        for name, deadlines in order if i % 2 else order[::-1]:
            plain[name].append(protocol_us(deadlines, args.chunks, pausing=False)[0])
            us, pauses = protocol_us(deadlines, args.chunks, pausing=True)
            paused[name].append(us)
    served, served_cpu = serve_runs(args.rounds, args.tokens)

    figures = (("chunk_us", plain), ("paused_chunk_us", paused), ("serve_tok_s", served),
               ("serve_cpu_us_per_tok", served_cpu))
    for kind, values in figures:
        print(f"{kind:20s} off: {' '.join(f'{v:8.2f}' for v in values['off'])}")
        print(f"{'':20s} on:  {' '.join(f'{v:8.2f}' for v in values['on'])}")
    result: dict[str, float | int] = {}
    for kind, values in figures:
        off, on = statistics.median(values["off"]), statistics.median(values["on"])
        result |= {f"{kind}_off": off, f"{kind}_on": on, f"{kind}_ratio": on / off}
    result["pauses"] = pauses
    print("RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in result.items()))


if __name__ == "__main__":
    main()
