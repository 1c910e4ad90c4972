"""What a client measures against what the server exports, when the client sets the pace.

``slopilot serve`` (simulated executor: A100 + Llama-3-8B in real time) and
``slopilot meter`` in front of it, each with ``--send-timeout``; through each, three
cases, one after the other, each read as the deltas of the exported series over it:

- ``slow``: one stream read by a client with a 1 KiB receive buffer taking 2,000 bytes
  every 100 ms (a slow link, ~20 KB/s). Client: its TTFT, its gap P99 (one a chunk
  with text after the first, however many tokens it brings: ``ClientGaps``' rule), the
  stream's end; exported: the TTFT and gap P99 of the histograms (``histogram_quantile``),
  the e2e latency (engine only).
- ``stall``: one stream whose client, with a 1 KiB receive buffer (``--stall-rcvbuf``; 0
  for the kernel's own), reads its head, then nothing for ``--stall`` seconds (past the
  send deadline), then the rest. Client: the bytes it got, its longest gap;
  exported: tokens counted delivered, send timeouts, aborts and requests judged met
  (engine), requests judged met (meter).
- ``fast``: ``--streams`` streams at once from one selector loop reading all it is given
  (a normal client on a fast link): client vs exported TTFT P50/P99 and gap P99, and the
  client's output tokens a second.

``--tree`` runs another source tree's ``slopilot`` (e.g. the main checkout, for the
figures before a change); this one's by default.

    .venv/bin/python benchmarks/client_pace.py [--tree PATH] [--streams 64]

Ends with ``RESULT key=value ...`` (keys ``<target>_<case>_<figure>``; ms, tokens/s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_quantile
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec

ROOT = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# The slow reader's gaps (100 ms every ~2 KB) miss a 50 ms target: its verdict shows which
# side of it the exported gaps put it on.
SLO = {"classes": {c: {"ttftP99Ms": 1000, "tbtP99Ms": 50} for c in ("p0", "p1", "p2")}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/metrics", timeout=2).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not start")
        time.sleep(0.2)


@contextlib.contextmanager
def _process(tree: Path, *args: str) -> Iterator[str]:
    """``slopilot <args>`` of ``tree`` on a free port; yields its URL."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "slopilot.cli", *args, "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"],
                            env=env, cwd=tree, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def scrape(url: str) -> Samples:
    out: Samples = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def delta(before: Samples, after: Samples) -> Samples:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def total(d: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in d.items()
               if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def quantile_ms(d: Samples, name: str, q: float) -> float:
    buckets: dict[float, float] = {}
    for (n, lab), v in d.items():
        if n == name + "_bucket":
            le = dict(lab)["le"]
            edge = math.inf if le == "+Inf" else float(le)
            buckets[edge] = buckets.get(edge, 0.0) + v
    return histogram_quantile(q, buckets) * 1e3


def pct_ms(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] * 1e3 if s else math.nan


def _request(host: str, max_tokens: int, cls: str) -> bytes:
    body = json.dumps({"prompt": "hi", "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "priority": cls}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json"
            b"\r\nx-slopilot-priority: %s\r\ncontent-length: %d\r\n\r\n"
            % (host.encode(), cls.encode(), len(body)) + body)


class _Client:
    """One stream's arrivals, as its client reads them (a chunk with text: one arrival)."""

    def __init__(self) -> None:
        self.buf = b""
        self.arrivals: list[float] = []
        self.bytes = 0
        self.done = False

    def feed(self, data: bytes, now: float) -> None:
        self.bytes += len(data)
        self.buf += data
        while b"\n\n" in self.buf:
            event, self.buf = self.buf.split(b"\n\n", 1)
            if b'"text":"' in event and b'"text":""' not in event:
                self.arrivals.append(now)
            if b"[DONE]" in event:
                self.done = True

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.split("//")[1].split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    return sock


def slow(url: str, engine: bool, max_tokens: int) -> dict[str, float]:
    before = scrape(url)
    client = _Client()
    with _connect(url, rcvbuf=1024) as sock:
        sent = time.perf_counter()
        sock.sendall(_request("x", max_tokens, "p2"))
        while not client.done:
            data = sock.recv(2000)  # what came, up to 2,000 bytes; then 100 ms away
            if not data:
                break
            client.feed(data, time.perf_counter())
            time.sleep(0.1)
        end = time.perf_counter() - sent
    time.sleep(0.5)
    d = delta(before, scrape(url))
    ttft, tbt = _names(engine)
    objectives = SLOSpec.from_dict(SLO).class_slo(Priority.P2)
    gaps = client.gaps()
    tbt_s = (objectives.tbt_p99_ms or math.inf) / 1e3
    client_met = bool(client.arrivals) and objectives.met(
        client.arrivals[0] - sent, len(gaps), sum(1 for g in gaps if g > tbt_s))
    out = {"client_ttft": (client.arrivals[0] - sent) * 1e3 if client.arrivals else math.nan,
           "ttft": quantile_ms(d, ttft, 0.99),
           "client_tbt_p99": pct_ms(gaps, 0.99), "tbt_p99": quantile_ms(d, tbt, 0.99),
           "client_end": end * 1e3, "client_bytes": float(client.bytes),
           "client_met": float(client_met),
           "met": total(d, "slopilot_slo_requests_total", met="true")}
    if engine:
        out["e2e"] = total(d, "vllm:e2e_request_latency_seconds_sum") * 1e3
    return out


def stall(url: str, engine: bool, max_tokens: int, stall_s: float,
          rcvbuf: int) -> dict[str, float]:
    before = scrape(url)
    client = _Client()
    with _connect(url, rcvbuf=rcvbuf or None) as sock:
        sock.sendall(_request("x", max_tokens, "p1"))
        client.feed(sock.recv(600), time.perf_counter())
        time.sleep(stall_s)
        sock.settimeout(10)
        with contextlib.suppress(OSError):
            while data := sock.recv(1 << 20):
                client.feed(data, time.perf_counter())
    time.sleep(0.5)
    d = delta(before, scrape(url))
    # The client took no byte for ``stall_s``: what did the server count meanwhile?
    out = {"client_bytes": float(client.bytes), "client_tokens": float(len(client.arrivals)),
           "met": total(d, "slopilot_slo_requests_total", met="true")}
    if engine:
        out["tokens"] = total(d, "vllm:generation_tokens_total")
        out["send_timeouts"] = total(d, "slopilot_send_timeouts_total")
        out["aborts"] = total(d, "vllm:request_success_total", finished_reason="abort")
    return out


def fast(url: str, engine: bool, streams: int, max_tokens: int) -> dict[str, float]:
    socks = [_connect(url) for _ in range(streams)]
    before = scrape(url)
    sel = selectors.DefaultSelector()
    clients: dict[socket.socket, tuple[_Client, float]] = {}
    start = time.perf_counter()
    for sock in socks:
        clients[sock] = (_Client(), time.perf_counter())
        sock.sendall(_request("x", max_tokens, "p0"))
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    left = streams
    while left:
        for key, _ in sel.select(60):
            sock = key.fileobj  # type: ignore[assignment]  # the sockets registered
            data = sock.recv(1 << 20)
            client = clients[sock][0]
            client.feed(data, time.perf_counter())
            if not data or client.done:
                sel.unregister(sock)
                left -= 1
    wall = time.perf_counter() - start
    for sock in socks:
        sock.close()
    time.sleep(0.5)
    d = delta(before, scrape(url))
    ttft, tbt = _names(engine)
    firsts = [c.arrivals[0] - sent for c, sent in clients.values() if c.arrivals]
    gaps = [g for c, _ in clients.values() for g in c.gaps()]
    tokens = sum(len(c.arrivals) for c, _ in clients.values())
    return {"client_ttft_p50": pct_ms(firsts, 0.5), "ttft_p50": quantile_ms(d, ttft, 0.5),
            "client_ttft_p99": pct_ms(firsts, 0.99), "ttft_p99": quantile_ms(d, ttft, 0.99),
            "client_tbt_p99": pct_ms(gaps, 0.99), "tbt_p99": quantile_ms(d, tbt, 0.99),
            "client_tok_s": tokens / wall}


def _names(engine: bool) -> tuple[str, str]:
    """The TTFT and gap histograms: the engine's own, or the meter's client-side ones."""
    if not engine:
        return ("slopilot_client_time_to_first_token_seconds",
                "slopilot_client_inter_token_latency_seconds")
    return "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the source tree to serve")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--fast-tokens", type=int, default=200)
    ap.add_argument("--slow-tokens", type=int, default=600)
    ap.add_argument("--stall-tokens", type=int, default=3000)
    ap.add_argument("--send-timeout", type=float, default=3.0)
    ap.add_argument("--stall", type=float, default=8.0)
    ap.add_argument("--stall-rcvbuf", type=int, default=1024,
                    help="the stalled client's SO_RCVBUF; 0: the kernel's own, which it "
                         "grows to tcp_rmem's maximum")
    ap.add_argument("--targets", default="engine,meter")
    ap.add_argument("--cases", default="fast,slow,stall")
    args = ap.parse_args()
    tree = args.tree.resolve()
    fields: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        slo = Path(tmp) / "slo.json"
        slo.write_text(json.dumps(SLO))
        timeout = ["--send-timeout", str(args.send_timeout)]
        with _process(tree, "serve", "--executor", "simulated", "--slo", str(slo),
                      *timeout) as engine, \
                _process(tree, "meter", "--upstream", engine, "--slo-file", str(slo),
                         *timeout) as meter:
            for target, url in (("engine", engine), ("meter", meter)):
                if target not in args.targets.split(","):
                    continue
                for case, figures in (
                        ("fast", lambda u=url, e=target == "engine":
                            fast(u, e, args.streams, args.fast_tokens)),
                        ("slow", lambda u=url, e=target == "engine": slow(u, e, args.slow_tokens)),
                        ("stall", lambda u=url, e=target == "engine":
                            stall(u, e, args.stall_tokens, args.stall,
                                  args.stall_rcvbuf))):
                    if case not in args.cases.split(","):
                        continue
                    got = figures()
                    print(f"{target} {case}: " + " ".join(f"{k}={v:.1f}" for k, v in got.items()),
                          flush=True)
                    fields.update({f"{target}_{case}_{k}": v for k, v in got.items()})
    tree_name = re.sub(r"[^\w.-]", "_", tree.name)
    print("RESULT tree=" + tree_name + " "
          + " ".join(f"{k}={v:.1f}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
