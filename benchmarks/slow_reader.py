"""When the send deadline lets a client that reads at its own pace go.

A uvicorn with ``slopilot``'s deadlines (h11, ``--send-timeout`` as ``send_s``) answers one
request with a ``--body``-byte body written at once; a raw-socket client with a
``--rcvbuf``-byte receive buffer (0: the kernel's own) reads ``--step`` bytes every
``--period`` seconds. Past the deadline the server drops the connection: the client
reads what its kernel got before that, then the end.

    .venv/bin/python benchmarks/slow_reader.py --send-s 3 --rcvbuf 4096 --step 1024 --period 0.5

Ends with ``RESULT read=<bytes> elapsed_s=<s> complete=<0|1> cut_after_s=<s since the
deadline was first armed, or nan>``; ``--max-s`` bounds the run.
"""

from __future__ import annotations

import argparse
import math
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from slopilot.engine.http_deadlines import Deadlines, with_deadlines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--send-s", type=float, default=3.0)
    ap.add_argument("--body", type=int, default=100_000)
    ap.add_argument("--rcvbuf", type=int, default=4096)
    ap.add_argument("--step", type=int, default=1024)
    ap.add_argument("--period", type=float, default=0.5)
    ap.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    ap.add_argument("--max-s", type=float, default=120.0)
    args = ap.parse_args()
    body = b"x" * args.body
    cut_at: list[float] = []
    armed_at: list[float] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    protocol: Any = with_deadlines(H11Protocol, Deadlines(send_s=args.send_s),
                                   on_send_timeout=lambda: cut_at.append(time.monotonic()))
    pause = protocol.pause_writing

    def paused(self: Any) -> None:
        if not armed_at:
            armed_at.append(time.monotonic())
        pause(self)

    protocol.pause_writing = paused
    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, loop=args.loop,
                                           log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    client = socket.socket()
    if args.rcvbuf:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, args.rcvbuf)
    client.connect(listener.getsockname())
    client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    start, got, ended = time.monotonic(), 0, False
    while time.monotonic() - start < args.max_s:
        try:
            data = client.recv(args.step)
        except ConnectionResetError:
            data = b""
        if not data:
            ended = True
            break
        got += len(data)
        if got >= len(body):  # with the head: the body is whole
            break
        time.sleep(args.period)
    elapsed = time.monotonic() - start
    server.should_exit = True
    cut = cut_at[0] - armed_at[0] if cut_at and armed_at else math.nan
    print(f"send_s={args.send_s} rcvbuf={args.rcvbuf} {args.step} B every {args.period} s: "
          f"read {got} B in {elapsed:.1f} s, {'cut' if cut_at else 'not cut'}"
          f"{', the end read' if ended else ''}")
    print(f"RESULT read={got} elapsed_s={elapsed:.1f} complete={int(got >= len(body))}"
          f" cut_after_s={cut:.1f}")


if __name__ == "__main__":
    main()
