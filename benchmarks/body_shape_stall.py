"""What a request body of a pathological shape costs the other clients' token streams.

A body's parse (``json.loads``, then pydantic) runs on the event loop that writes every
stream's chunks, and its cost is its JSON values, not its bytes. This script serves the
simulated executor (``slopilot serve --executor simulated``, its 10 ms decode step in
real time; a model of 8,192 tokens of context and 128,256 token ids) from a tree of the
code (this one, and with ``--before`` another checkout, e.g. ``git archive main``
unpacked), streams ``--streams`` long completions at it over bare sockets (every text
event stamped as it arrives) and, once they flow, sends ``--bodies`` bodies of one
shape at once, under the 16 MiB body cap:

- ``values``: a short prompt and one ignored field ``"x": [1, 1, ...]`` (5.5 million
  items, 16.5 MB);
- ``keys``: a short prompt and 800,000 unknown keys (13 MB);
- ``logit_bias``: a short prompt and a bias for every token id (a request the server
  serves);
- ``batch``: 16 prompts of token ids, each the whole context but one token (served).

Per round, the longest gap between two text events of any stream from the bodies' send
until every answer came back, and the longest /health round trip probed every 50 ms
meanwhile; the median over ``--rounds``. Also each body's status.

    .venv/bin/python benchmarks/body_shape_stall.py [--before DIR] [--shape values]
        [--bodies 3] [--rounds 3] [--streams 4]

Ends with ``RESULT shape=... bodies=... stall_ms_TREE=... health_ms_TREE=...
status_TREE=...`` for ``after`` (this tree) and, with ``--before``, ``before``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from serving_latency import serve  # noqa: E402

VOCAB = 128_256  # the simulated Llama-3-8B's
CONTEXT = 8192


def body_of(shape: str) -> bytes:
    head: dict[str, object] = {"prompt": "hi", "max_tokens": 1}
    if shape == "values":
        return json.dumps({**head, "x": [1] * 5_500_000}).encode()
    if shape == "keys":
        return json.dumps({**head, **{f"k{i}": 1 for i in range(800_000)}}).encode()
    if shape == "logit_bias":
        return json.dumps({**head, "logit_bias": {str(t): 1.0 for t in range(VOCAB)}}
                          ).encode()
    if shape == "batch":
        return json.dumps({**head, "prompt": [[1] * (CONTEXT - 1)] * 16}).encode()
    raise ValueError(f"shape={shape!r}: values, keys, logit_bias or batch")


async def _exchange(host: str, port: int, head: bytes, body: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head + body)
    answer = b""
    try:
        while chunk := await reader.read(1 << 16):
            answer += chunk
    except ConnectionResetError:
        pass  # refused before the body was all sent: its answer came first
    writer.close()
    return answer


def _send(host: str, port: int, body: bytes) -> bytes:
    """One body sent on a thread of its own, by blocking calls that let go of the GIL:
    an asyncio transport moves a large write's buffer down at each send, and its copies
    (hundreds of ms for 16 MB) held this process's loop, which stamps the streams."""
    answer = b""
    with socket.create_connection((host, port)) as sock:
        try:
            sock.sendall(_post_head(body))
            sock.sendall(body)
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused before the body was all sent: its answer came first
        try:
            while chunk := sock.recv(1 << 16):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def _post_head(body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))


async def _stream(host: str, port: int, stamps: list[float], stop: asyncio.Event) -> None:
    """Streamed completions one after another until ``stop``: each text event's time."""
    while not stop.is_set():
        body = json.dumps({"prompt": "stream", "max_tokens": 2000, "stream": True,
                           "ignore_eos": True}).encode()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_post_head(body) + body)
        while not stop.is_set() and (line := await reader.readline()):
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
        writer.close()


async def _health(host: str, port: int, trips: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        sent = time.perf_counter()
        await _exchange(host, port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                        b"Connection: close\r\n\r\n")
        trips.append(time.perf_counter() - sent)
        await asyncio.sleep(0.05)


async def one_round(host: str, port: int, body: bytes, args: argparse.Namespace
                    ) -> tuple[float, float, list[str]]:
    stop = asyncio.Event()
    per_stream: list[list[float]] = [[] for _ in range(args.streams)]
    streams = [asyncio.ensure_future(_stream(host, port, s, stop)) for s in per_stream]
    await asyncio.sleep(1.0)  # the streams under way
    trips: list[float] = []
    probe = asyncio.ensure_future(_health(host, port, trips, stop))
    start = time.perf_counter()
    loop = asyncio.get_running_loop()
    answers = await asyncio.gather(*(loop.run_in_executor(None, _send, host, port, body)
                                     for _ in range(args.bodies)))
    if not args.bodies:
        await asyncio.sleep(1.0)  # the control: as long a window without them
    end = time.perf_counter() + 0.2  # a gap the last answer closed shows after it
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*streams, probe, return_exceptions=True)
    stall = 0.0
    for stamps in per_stream:
        inside = [t for t in stamps if start <= t <= end]
        before = [t for t in stamps if t < start]
        points = ([before[-1]] if before else []) + inside
        stall = max([stall, *(b - a for a, b in itertools.pairwise(points))])
    statuses = [a.split(b" ", 2)[1].decode() if a.startswith(b"HTTP/") else "none"
                for a in answers]
    return stall, max(trips, default=float("nan")), statuses


def measure(tree: Path, body: bytes, args: argparse.Namespace
            ) -> tuple[float, float, list[str]]:
    stalls, healths, statuses = [], [], []
    with serve("--executor", "simulated", tree=tree) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for _ in range(args.rounds):
            stall, health, status = asyncio.run(one_round(host, int(port), body, args))
            stalls.append(stall)
            healths.append(health)
            statuses = status
            print(f"  {tree}: stall {stall * 1e3:.0f} ms, /health {health * 1e3:.0f} ms, "
                  f"{status}", flush=True)
    return statistics.median(stalls), statistics.median(healths), statuses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    p.add_argument("--shape", choices=("values", "keys", "logit_bias", "batch"), default="values")
    p.add_argument("--bodies", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", type=int, default=4)
    args = p.parse_args()
    body = body_of(args.shape)
    print(f"{args.shape}: {len(body):,} bytes x {args.bodies}", flush=True)
    trees = {"after": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    fields = [f"shape={args.shape}", f"bodies={args.bodies}", f"rounds={args.rounds}"]
    for name, tree in trees.items():
        stall, health, statuses = measure(tree, body, args)
        fields += [f"stall_ms_{name}={stall * 1e3:.0f}", f"health_ms_{name}={health * 1e3:.0f}",
                   f"status_{name}={','.join(sorted(set(statuses)))}"]
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
