"""What slow-reading clients hold of ``slopilot serve``, with and without the connection
cap (``--max-connections``), and whether a fresh client and the kubelet's probe get in.

Each run starts a server (the simulated engine, in a process of its own under
``ulimit -n`` ``--nofile``), then opens ``--clients`` connections, each with a 4 KiB
receive buffer, asking for a streamed completion of ``--max-tokens`` tokens and reading
nothing of it: the slow readers. After ``--settle-s`` it counts the server's descriptors
and resident memory (``/proc``), what the slow readers were answered (a stream begun, a
503, nothing yet), then asks ``GET /v1/models`` as a fresh client and ``GET /health`` as
the probe, each within ``--probe-timeout-s``. "uncapped" is today's server before the
cap (a cap of a million, never reached); "capped" the default for ``--nofile``.

    .venv/bin/python benchmarks/connection_cap.py --clients 300 --nofile 256

Ends with ``RESULT key=value ...``: per run (``uncapped_``, ``capped_``) ``fds``,
``rss_mib``, ``streams`` (slow readers being answered), ``refused`` (503s),
``waiting`` (no answer yet), ``error`` (the connection failed), ``fresh`` and
``probe`` (the status, or ``timeout``, or httpx's error: ``ReadError`` where the server
took the connection and dropped it for want of a descriptor).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

UNCAPPED = 1_000_000


def _worker(nofile: int, cap: int) -> None:
    """The server, in this process: prints its port, serves until stdin closes."""
    # Soft and hard: the server raises a soft limit to the hard one at its start.
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    from slopilot.engine.config import EngineConfig
    from slopilot.engine.server.backends import build_simulated
    from slopilot.engine.server.uvicorn_runner import make_server, run_in_thread

    backend = build_simulated(EngineConfig(), scenario="tiny-cpu")
    server = make_server(backend, port=0, max_connections=cap, log_level="critical")
    run_in_thread(server)
    print(f"PORT {server.bound_port}", flush=True)
    sys.stdin.read()
    server.should_exit = True


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _slow_reader(port: int, body: bytes) -> socket.socket | None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5.0)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    except OSError:
        sock.close()
        return None
    return sock


def _answered(sock: socket.socket) -> str:
    """What the server wrote this slow reader so far, peeked, not read."""
    sock.setblocking(False)
    try:
        head = sock.recv(16, socket.MSG_PEEK)
    except BlockingIOError:
        return "waiting"
    except OSError:
        return "error"
    if head.startswith(b"HTTP/1.1 503"):
        return "refused"
    return "streams" if head.startswith(b"HTTP/1.1 200") else "waiting"


def _ask(url: str, timeout_s: float) -> str:
    try:
        return str(httpx.get(url, timeout=timeout_s).status_code)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.HTTPError as exc:
        return type(exc).__name__


def _run(name: str, cap: int, args: argparse.Namespace) -> dict[str, object]:
    worker = subprocess.Popen(
        [sys.executable, __file__, "--worker", "--nofile", str(args.nofile), "--cap",
         str(cap)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdin is not None
    line = worker.stdout.readline()
    if not line.startswith("PORT "):
        raise RuntimeError(f"{name}: the server did not start: {line!r}")
    port = int(line.split()[1])
    url = f"http://127.0.0.1:{port}"
    body = (b'{"prompt": "hi", "max_tokens": %d, "stream": true, "ignore_eos": true}'
            % args.max_tokens)
    idle = {"fds": _fds(worker.pid), "rss_mib": round(_rss_mib(worker.pid), 1)}
    socks = [s for s in (_slow_reader(port, body) for _ in range(args.clients)) if s]
    try:
        time.sleep(args.settle_s)  # the server takes what it can of them
        out: dict[str, object] = {
            "idle_fds": idle["fds"], "fds": _fds(worker.pid),
            "rss_mib": round(_rss_mib(worker.pid), 1), "connected": len(socks)}
        answers = [_answered(s) for s in socks]
        for kind in ("streams", "refused", "waiting", "error"):
            out[kind] = answers.count(kind)
        out["fresh"] = _ask(f"{url}/v1/models", args.probe_timeout_s)
        out["probe"] = _ask(f"{url}/health", args.probe_timeout_s)
    finally:
        for s in socks:
            s.close()
        worker.stdin.close()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    print(f"{name}: " + " ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--nofile", type=int, default=256)
    ap.add_argument("--cap", type=int, default=None,
                    help="the capped run's --max-connections (default: the server's own "
                    "for --nofile)")
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--probe-timeout-s", type=float, default=5.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.nofile, args.cap)
        return
    from slopilot.engine.connection_cap import default_max_connections

    cap = args.cap or default_max_connections(1, args.nofile)
    fields = [f"clients={args.clients}", f"nofile={args.nofile}", f"cap={cap}"]
    for name, run_cap in (("uncapped", UNCAPPED), ("capped", cap)):
        out = _run(name, run_cap, args)
        fields += [f"{name}_{k}={v}" for k, v in out.items()]
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
