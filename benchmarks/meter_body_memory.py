"""What the request bodies a client may send cost the meter: its peak memory (VmHWM), and
how long its event loop, which relays every stream, stalls meanwhile.

Each case starts a ``slopilot meter`` process of ``--tree`` (this repository by default;
a checkout of another commit measures that one: it is given no flag of this tree's), with
its default limits, in front of one of two stand-in engines on the loopback:

- ``silent``: a socket that listens and never accepts (the kernel takes the connection
  and some MiB of body into its buffers, then the meter's send waits);
- ``refuses``: reads each request whole and answers 400, as vLLM answers a body it will
  not take.

Meanwhile a probe asks the meter every 5 ms for ``GET *`` (a request target that is no
path: the meter answers 400 itself, on its loop): the longest of those answers, less the
median, is the stall. The cases (``none`` first: no body, the probe's own spread on this
machine), the reviewer's bodies next:

- ``batch``: a completions stream of 40,000 prompts "a" and ``n`` 128 (160 KB), the
  engine silent, its client gone after 1 s (past the TTFT target): 5,120,000 choices;
- ``nested_refused`` and ``nested_silent``: 8 MiB of one-token prompts
  (``{"prompt": [[1],[1],...]}``), the engine refusing it, or silent (the client gone
  after 3 s);
- ``text60``: a 60 MiB text prompt, the engine refusing it;
- ``concurrent``: ``--clients`` text prompts of 15 MiB at once, the engine silent (the
  clients gone after 4 s).

    .venv/bin/python benchmarks/meter_body_memory.py [--tree DIR] [--cases batch,...]
        [--clients 32]

Ends with ``RESULT`` and, per case, ``CASE_peak_mb`` (VmHWM), ``CASE_stall_ms`` and
``CASE_status`` (the meter's answer to the body; 0: none before the client left), and
``idle_mb`` (VmRSS once started and a first small request sent on). Then, in this
process, the 8 MiB of one-token prompts read as this tree's meter reads a body
(``request_fields.scan``): its longest step and all of them (``scan_step_max_ms``,
``scan_ms``), beside ``json.loads`` of it in one go (``json_loads_ms``), the medians of 5.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SLO = {"classes": {"p0": {"ttftP99Ms": 500, "tbtP99Ms": 100}}}
MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def silent() -> Iterator[int]:
    """An engine that listens and never accepts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def refusing() -> Iterator[int]:
    """An engine that reads each request whole and answers it 400."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            while True:
                length = None
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if not line:
                    return
                left = length or 0
                while left:
                    left -= len(f.read(min(left, MIB)))
                body = b'{"error": {"message": "no"}}'
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


@contextlib.contextmanager
def meter(tree: Path, upstream: int, slo_file: Path) -> Iterator[tuple[int, int]]:
    """A meter process of ``tree`` (its pid and port)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from slopilot.cli import main; sys.exit(main())",
         "meter", "--upstream", f"http://127.0.0.1:{upstream}", "--slo-file", str(slo_file),
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "error"],
        env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the meter did not start")
            time.sleep(0.1)
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(30)


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


PROBE = r"""
import select, socket, sys, time
port, times = int(sys.argv[1]), []
while True:
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
            s.sendall(b"GET * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            while s.recv(65536):
                pass
        times.append(time.perf_counter() - start)
    except OSError:
        pass
    if select.select([sys.stdin], [], [], 0.005)[0]:
        break
print(max(times) - sorted(times)[len(times) // 2])
"""


class Probe:
    """``GET *`` every 5 ms, one connection at a time, from a process of its own (this
    one's threads, sending the bodies, would stretch its times)."""

    def __init__(self, port: int) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", PROBE, str(port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def stall_ms(self) -> float:
        out, _ = self._proc.communicate(b"stop\n", timeout=150)
        return float(out) * 1e3


def send(port: int, body: bytes, leave_after: float | None) -> int:
    """``body`` POSTed to /v1/completions; the status, or 0 where the client left after
    ``leave_after`` seconds with none."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                  b"application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
        with contextlib.suppress(OSError):
            s.sendall(body)
        s.settimeout(leave_after if leave_after is not None else 300)
        try:
            head = s.recv(64)
        except TimeoutError:
            return 0
        return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0


def nested(size: int) -> bytes:
    return b'{"model": "m", "stream": true, "prompt": [' + \
        b",".join([b"[1]"] * (size // 4)) + b"]}"


def text(size: int) -> bytes:
    return b'{"model": "m", "stream": true, "prompt": "' + b"a" * size + b'"}'


CASES: dict[str, tuple[Callable[[], bytes], str, float | None]] = {
    "batch": (lambda: json.dumps({"model": "m", "prompt": ["a"] * 40_000, "n": 128,
                                  "stream": True}).encode(), "silent", 1.0),
    "nested_refused": (lambda: nested(8 * MIB), "refuses", None),
    "nested_silent": (lambda: nested(8 * MIB), "silent", 3.0),
    "text60": (lambda: text(60 * MIB), "refuses", None),
}


def run_case(tree: Path, name: str, slo_file: Path, clients: int) -> dict[str, float]:
    if name == "none":
        make, engine, leave, count = (lambda: b""), "silent", None, 0
    elif name == "concurrent":
        make, engine, leave, count = (lambda: text(15 * MIB)), "silent", 4.0, clients
    else:
        (make, engine, leave), count = CASES[name], 1
    body = make()
    with (silent() if engine == "silent" else refusing()) as upstream, \
            meter(tree, upstream, slo_file) as (pid, port):
        # A first request to the engine imports httpx's network backend, 20-40 ms of
        # the loop once: not the body's.
        send(port, b'{"model": "m", "prompt": "a"}', 0.5)
        idle = _status_kb(pid, "VmRSS") / 1024
        probe = Probe(port)
        time.sleep(0.3)
        statuses: list[int] = []
        senders = [threading.Thread(target=lambda: statuses.append(send(port, body, leave)))
                   for _ in range(count)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        time.sleep(1.0 if count else 3.0)  # what the meter still does once they left
        stall = probe.stall_ms()
        peak = _status_kb(pid, "VmHWM") / 1024
    return {"idle_mb": idle, f"{name}_peak_mb": peak, f"{name}_stall_ms": stall,
            f"{name}_status": max(statuses, default=0)}


def scan_times() -> dict[str, float]:
    from slopilot.engine.meter.request_fields import scan
    from slopilot.engine.meter.request_plan import READS

    body = nested(8 * MIB)
    longest, whole, loads = [], [], []
    for _ in range(5):
        steps, times = scan(body, READS, "prompt"), []
        while True:
            start = time.perf_counter()
            try:
                next(steps)
            except StopIteration:
                times.append(time.perf_counter() - start)
                break
            times.append(time.perf_counter() - start)
        longest.append(max(times))
        whole.append(sum(times))
        start = time.perf_counter()
        json.loads(body)
        loads.append(time.perf_counter() - start)
    return {"scan_step_max_ms": statistics.median(longest) * 1e3,
            "scan_ms": statistics.median(whole) * 1e3,
            "json_loads_ms": statistics.median(loads) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--cases", default="none,batch,nested_refused,nested_silent,"
                        "text60,concurrent")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        slo_file = Path(tmp) / "slo.json"
        slo_file.write_text(json.dumps(SLO))
        for name in args.cases.split(","):
            got = run_case(args.tree.resolve(), name, slo_file, args.clients)
            results["idle_mb"] = max(results.get("idle_mb", 0.0), got.pop("idle_mb"))
            results.update(got)
            print(name, got, flush=True)
    if args.tree.resolve() == ROOT:
        results.update(scan_times())
    print("RESULT " + " ".join(f"{k}={v:.0f}" if not k.endswith("_ms") else f"{k}={v:.1f}"
                               for k, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
