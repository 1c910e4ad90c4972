"""Serving latency as clients see it: three checks on ``slopilot serve`` (issue 11).

1. Idle stalls: TTFT of a request sent the moment the previous one ended against TTFT
   after a pause, tiny-random on the torch executor with 262,144 KV blocks (the CPU
   default). Going idle used to run an O(blocks) integrity check that the next request
   waited behind.
2. Event-loop stalls: the TBT p99 of running streams before and while a 1 MB prompt is
   tokenized (tiny-random's real tokenizer); tokenizing used to run on the event loop.
3. TTFT truth: the server's mean TTFT (vllm:time_to_first_token_seconds sum/count)
   against the official ``openai`` client's, streaming at a steady >= 10 requests/s on
   the simulated executor, and against a bare socket client's (what the wire sees,
   without the SDK's own time); the server used to stamp arrival after parsing and the
   first token before its chunk was written. Inside the openai client a stamping
   transport splits its TTFT into the SDK's time before httpx has the request, the
   wire's time to the first text event's bytes (what a server stamp can match), and the
   SDK's time turning those bytes into a chunk.
4. TBT truth: the server's inter-token latency (vllm:inter_token_latency_seconds, the
   gap between the writes of the chunks that bring tokens, one a chunk after the first
   however many it brings, observed for the tokens handed out)
   against the gaps between text events a bare socket client reads, streaming at the same
   steady rate on the simulated executor: the mean, and the p99 (the client's exact; the
   server's interpolated in its buckets as Prometheus's histogram_quantile does).

Each part starts its own server process (the code of the tree this script is in) and
talks to it over HTTP from this process.

    .venv/bin/python benchmarks/serving_latency.py [--parts idle,tokenize,ttft,tbt]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import httpx
import httpx2
import openai

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def serve(*args: str, env_extra: dict[str, str] | None = None,
          launcher: Sequence[str] = ("-m", "slopilot.cli"), tree: Path = ROOT
          ) -> Iterator[str]:
    """A ``slopilot serve`` process of ``tree``'s code (this one's by default: another
    tree's for a before/after run); yields its URL. ``launcher``: what Python runs, given
    ``serve`` and its flags (``made_time_engine.py``: with one more observer on the
    engine)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    proc = subprocess.Popen([sys.executable, *launcher, "serve", "--port", "0",
                             "--log-level", "warning", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=tree)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"ready at (http://\S+)", line)
        if not match:
            raise RuntimeError(f"the server in {tree} did not start: {line!r}")
        yield match.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def stream_ttft(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> float:
    """Seconds from the call to the first chunk carrying text."""
    start = time.perf_counter()
    ttft = float("nan")
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                           stream=True, temperature=0,
                                           extra_body={"ignore_eos": True}):
        if ttft != ttft and chunk.choices and chunk.choices[0].text:
            ttft = time.perf_counter() - start
    return ttft


def interleaved(fn: Callable[[], float], n: int, pause_s: float) -> tuple[list[float], list[float]]:
    """``fn``'s seconds back to back and after a pause, in interleaved pairs (pause, call,
    call at once), so that the load of a shared machine drifting over the run weighs on
    both kinds alike."""
    b2b, paused = [], []
    for _ in range(n):
        time.sleep(pause_s)
        paused.append(fn())
        b2b.append(fn())
    return b2b, paused


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return run


def forward_control() -> Callable[[], float]:
    """tiny-random's forward over 8 tokens in this process, in transformers: the same
    size of work with neither the server nor the engine in it."""
    import torch
    from transformers import AutoModelForCausalLM

    from slopilot.engine.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random")).eval()
    ids = torch.arange(1, 9).unsqueeze(0)

    def forward() -> None:
        with torch.inference_mode():
            model(ids)
    for _ in range(3):
        forward()
    return timed(forward)


def part_idle(n: int, pause_s: float) -> dict[str, float]:
    """The engine's TTFT back to back and after a pause, beside two controls through the
    same pauses that hold no engine work: the same client listing the same server's
    models (the HTTP path only), and the model's forward with no server. A machine that
    loses its caches while idle (a VM whose cores other tenants use) makes every one of
    them slower after a pause; an idle stall of the engine's own shows as a TTFT ratio
    below the controls'."""
    with serve("--executor", "torch", "--model", "tiny-random",
               "--num-gpu-blocks", "262144") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        stream_ttft(client, model, "warm up", 4)
        count = itertools.count()
        b2b, paused = interleaved(
            lambda: stream_ttft(client, model, f"request {next(count)} says hello", 8),
            n, pause_s)
        http = interleaved(timed(client.models.list), n, pause_s)
    forward = interleaved(forward_control(), n, pause_s)
    b, p = statistics.median(b2b), statistics.median(paused)
    print(f"idle: TTFT back-to-back median {b * 1e3:.1f} ms (p90 {pct(b2b, 0.9) * 1e3:.1f}), "
          f"after a {pause_s:g} s pause {p * 1e3:.1f} ms (p90 {pct(paused, 0.9) * 1e3:.1f})")
    fields = {"ttft_b2b_ms": b * 1e3, "ttft_paused_ms": p * 1e3, "b2b_over_paused_ratio": b / p,
              "ttft_pause_cost_ms": (p - b) * 1e3}
    for name, (cb, cp) in (("http", http), ("forward", forward)):
        mb, mp = statistics.median(cb), statistics.median(cp)
        print(f"idle control, {name}: back-to-back {mb * 1e3:.2f} ms, after the pause "
              f"{mp * 1e3:.2f} ms ({(mp - mb) * 1e3:+.2f} ms, ratio {mb / mp:.2f})")
        fields |= {f"control_{name}_b2b_over_paused_ratio": mb / mp,
                   f"control_{name}_pause_cost_ms": (mp - mb) * 1e3}
    return fields


def _gaps(url: str, model: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Stream one long request after another until ``stop``; record (time, gap)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    while not stop.is_set():
        last = None
        for _ in client.completions.create(model=model, prompt="keep talking", max_tokens=400,
                                           stream=True, extra_body={"ignore_eos": True}):
            now = time.perf_counter()
            if last is not None:
                out.append((now, now - last))
            last = now
            if stop.is_set():
                break


def part_tokenize(streams: int, prompt_mb: float, base_s: float) -> dict[str, float]:
    # One torch thread: what is measured is the event loop, and on a small box a second
    # OpenMP thread spinning against the tokenizer's core would swamp it.
    with serve("--executor", "torch", "--model", "tiny-random", "--num-gpu-blocks", "4096",
               env_extra={"OMP_NUM_THREADS": "1"}) as url:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        stop = threading.Event()
        gaps: list[tuple[float, float]] = []
        workers = [threading.Thread(target=_gaps, args=(url, model, stop, gaps))
                   for _ in range(streams)]
        for w in workers:
            w.start()
        time.sleep(base_s)
        text = ("The quick brown fox jumps over the lazy dog. " * 40_000)[:int(prompt_mb * 1e6)]
        t0 = time.perf_counter()
        res = httpx.post(url + "/v1/completions", timeout=300,
                         json={"model": model, "prompt": text, "max_tokens": 1})
        t1 = time.perf_counter()
        time.sleep(1.0)
        stop.set()
        for w in workers:
            w.join(60)
    # A gap is the time between two chunks of one stream, stamped at its end: "during"
    # is every gap that overlaps the tokenizing (a frozen stream's one long gap ends
    # after it), "before" every gap wholly inside the second half of the quiet spell.
    base = [g for t, g in gaps if t0 - base_s / 2 < t - g and t < t0]
    during = [g for t, g in gaps if t >= t0 and t - g <= t1]
    b99, d99 = pct(base, 0.99), pct(during, 0.99)
    print(f"tokenize: {prompt_mb:g} MB prompt answered {res.status_code} after "
          f"{t1 - t0:.2f} s; {streams} streams' TBT p99 {b99 * 1e3:.1f} ms before "
          f"({len(base)} gaps), {d99 * 1e3:.1f} ms while tokenizing ({len(during)} gaps), "
          f"max {max(during, default=0) * 1e3:.1f} ms")
    return {"tbt_p99_before_ms": b99 * 1e3, "tbt_p99_tokenizing_ms": d99 * 1e3,
            "tbt_p99_rise_ms": (d99 - b99) * 1e3, "tokenize_s": t1 - t0}


def _ttft_sum_count(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    total = sum(float(v) for v in re.findall(
        r"^vllm:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", text, re.M))
    count = sum(float(v) for v in re.findall(
        r"^vllm:time_to_first_token_seconds_count\{[^}]*\} (\S+)$", text, re.M))
    return total, count


@overload
async def _raw_text_events(url: str, body: dict[str, object]) -> list[float]: ...


@overload
async def _raw_text_events(url: str, body: dict[str, object], *,
                           count: Callable[[bytes], int]) -> list[tuple[float, int]]: ...


async def _raw_text_events(url: str, body: dict[str, object], *,
                           count: Callable[[bytes], int] | None = None
                           ) -> list[float] | list[tuple[float, int]]:
    """When each text event of a stream arrived, from before the connection: raw HTTP/1.1
    over a socket, no SDK, no parsing but one line. With ``count``, each stamp comes
    with ``count(line)``, taken once the stamp is."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
                 + payload)
    stamps: list[float] = []
    lines: list[bytes] = []
    while line := await reader.readline():
        if _text_line(line):
            stamps.append(time.perf_counter() - start)
            lines.append(line)
    writer.close()
    if count is None:
        return stamps
    return [(stamp, count(line)) for stamp, line in zip(stamps, lines, strict=True)]


async def _raw_ttft(url: str, body: dict[str, object]) -> float | None:
    """TTFT on the wire."""
    stamps = await _raw_text_events(url, body)
    return stamps[0] if stamps else None


async def _at_rate(rate: float, seconds: float,
                   one: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Open loop: ``one(i)`` started every 1/rate s for ``seconds``, then all awaited."""
    tasks = []
    t0 = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


# The header that ties a request's transport stamps to the SDK call that made it.
_ID_HEADER = "x-bench-request"


def _text_line(line: bytes) -> bool:
    """An SSE event carrying text: what both clients count as the first token."""
    return line.startswith(b"data: {") and b'"text":""' not in line


class _StampingTransport(httpx2.AsyncBaseTransport):
    """The ``openai`` client's own transport, stamping what the SDK hides: when it hands
    a request to httpx and when the first text event's bytes come off the socket.

    Both stamps are taken inside the client's process on the same requests the SDK
    times, so the SDK's TTFT splits into its time before sending, the wire's time (the
    figure a server stamp can match) and its time parsing the first event.
    """

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.sent: dict[str, float] = {}
        self.first_text: dict[str, float] = {}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key = request.headers.get(_ID_HEADER, "")
        self.sent[key] = time.perf_counter()
        response = await self.inner.handle_async_request(request)
        if key and isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = _StampedStream(response.stream, key, self.first_text)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _StampedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, key: str,
                 first_text: dict[str, float]) -> None:
        self.inner, self.key, self.first_text = inner, key, first_text

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            if self.key not in self.first_text and any(
                    _text_line(line) for line in chunk.split(b"\n")):
                self.first_text[self.key] = time.perf_counter()
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class _Ttfts:
    """Seconds from the call to the first text, per request; in the openai mode also
    (sent, first text bytes, first text) for each request whose bytes were stamped."""

    first: list[float] = field(default_factory=list)
    stamped: list[tuple[float, float, float]] = field(default_factory=list)


async def _open_loop(url: str, rate: float, seconds: float, raw: bool = False) -> _Ttfts:
    transport = _StampingTransport()
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=transport, timeout=60))
    model = (await client.models.list()).data[0].id
    out = _Ttfts()

    async def one(i: int) -> None:
        prompt = f"user {i} asks a short question"
        if raw:
            first = await _raw_ttft(url, {"model": model, "prompt": prompt, "max_tokens": 16,
                                          "stream": True, "ignore_eos": True})
            if first is not None:
                out.first.append(first)
            return
        key = str(i)
        start = time.perf_counter()
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=16, stream=True,
            extra_body={"ignore_eos": True}, extra_headers={_ID_HEADER: key})
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - start
        if first is None:
            return
        out.first.append(first)
        if key in transport.first_text:
            out.stamped.append((transport.sent[key] - start,
                                transport.first_text[key] - start, first))

    await _at_rate(rate, seconds, one)
    await client.close()
    return out


def part_ttft(rate: float, seconds: float) -> dict[str, float]:
    fields: dict[str, float] = {}
    with serve("--executor", "simulated") as url:
        asyncio.run(_open_loop(url, rate, 2.0))  # warm up
        # The openai client, then a bare socket client: the difference between the two
        # is the SDK's own time, which no server stamp can see.
        for name, raw in (("client", False), ("wire", True)):
            s0, c0 = _ttft_sum_count(url)
            ttfts = asyncio.run(_open_loop(url, rate, seconds, raw=raw))
            s1, c1 = _ttft_sum_count(url)
            server = (s1 - s0) / (c1 - c0)
            mean = statistics.fmean(ttfts.first)
            gap = mean - server
            who = "openai client" if name == "client" else "bare socket client"
            print(f"ttft: {len(ttfts.first)} streams at {rate:g}/s; {who} mean "
                  f"{mean * 1e3:.2f} ms, server mean {server * 1e3:.2f} ms ({c1 - c0:.0f} "
                  f"requests): server reads {gap * 1e3:.2f} ms ({gap / mean:.1%}) below")
            fields |= {f"{name}_ttft_ms": mean * 1e3, f"server_vs_{name}_ttft_ms": server * 1e3,
                       f"server_{name}_gap_ms": gap * 1e3,
                       f"server_over_{name}_ratio": server / mean}
            if ttfts.stamped:
                fields |= _sdk_split(ttfts, server)
    return fields


def _itl_histogram(url: str) -> dict[float, float]:
    """The server's inter-token latency buckets (every class summed): le -> count,
    with the sum under ``-1`` and the count under ``-2``."""
    text = httpx.get(url + "/metrics").text
    out: dict[float, float] = {}
    for le, value in re.findall(r'^vllm:inter_token_latency_seconds_bucket\{[^}]*le="([^"]+)"'
                                r"[^}]*\} (\S+)$", text, re.M):
        edge = float("inf") if le == "+Inf" else float(le)
        out[edge] = out.get(edge, 0.0) + float(value)
    for key, series in ((-1.0, "sum"), (-2.0, "count")):
        out[key] = sum(float(v) for v in re.findall(
            rf"^vllm:inter_token_latency_seconds_{series}\{{[^}}]*\}} (\S+)$", text, re.M))
    return out


def _bucket_quantile(q: float, buckets: dict[float, float]) -> float:
    """histogram_quantile over cumulative (le, count) pairs: linear within the bucket."""
    edges = sorted(e for e in buckets if e >= 0)
    total = buckets[edges[-1]]
    rank, lower, below = q * total, 0.0, 0.0
    for edge in edges:
        if buckets[edge] >= rank:
            if edge == float("inf"):
                return lower
            inside = buckets[edge] - below
            return lower + (edge - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = edge, buckets[edge]
    return lower


async def _tbt_load(url: str, rate: float, seconds: float, tokens: int,
                    logprobs: int | None = None) -> list[float]:
    """Each gap as a client sees it, read off a bare socket: the time between the text
    events of a stream that bring tokens, one an event after the first, however many it
    brings (``ClientGaps``, as ``vllm bench serve`` times them)."""
    gaps: list[float] = []

    async def one(i: int) -> None:
        body: dict[str, object] = {"prompt": f"user {i} asks a question",
                                   "max_tokens": tokens, "stream": True, "ignore_eos": True}
        if logprobs is not None:
            body["logprobs"] = logprobs
        events = await _raw_text_events(url, body, count=_event_tokens)
        at = [stamp for stamp, n in events if n]
        gaps.extend(b - a for a, b in itertools.pairwise(at))

    await _at_rate(rate, seconds, one)
    return gaps


def _event_tokens(line: bytes) -> int:
    """How many tokens a text event brings (the placeholder tokenizer's are words)."""
    return sum(len(str(c.get("text") or "").split())
               for c in json.loads(line[6:]).get("choices") or ())


# Gap lengths whose share both sides count exactly: edges of the server's buckets, at and
# around the simulated executor's 10 ms decode step.
_OVER_EDGES_S = (0.015, 0.02, 0.03)


def part_tbt(rate: float, seconds: float, tokens: int = 32,
             logprobs: int | None = None) -> dict[str, float]:
    """``logprobs``: each stream asks for that many top logprobs per token, which the
    server formats into every chunk on its event loop: a busy loop delays the writes,
    which the client sees and the engine's own gaps do not."""
    with serve("--executor", "simulated") as url:
        asyncio.run(_tbt_load(url, rate, 2.0, tokens, logprobs))  # warm up
        before = _itl_histogram(url)
        client = asyncio.run(_tbt_load(url, rate, seconds, tokens, logprobs))
        after = _itl_histogram(url)
    diff = {k: after[k] - before.get(k, 0.0) for k in after}
    count, total = diff.pop(-2.0), diff.pop(-1.0)
    server_mean, client_mean = total / count, statistics.fmean(client)
    server_p99, client_p99 = _bucket_quantile(0.99, diff), pct(client, 0.99)
    print(f"tbt: {len(client)} gaps read by the client, {count:.0f} observed by the "
          f"server; mean {client_mean * 1e3:.2f} ms client, {server_mean * 1e3:.2f} ms "
          f"server; p99 {client_p99 * 1e3:.2f} ms client, {server_p99 * 1e3:.2f} ms server "
          "(interpolated in its buckets)")
    fields = {"client_itl_ms": client_mean * 1e3, "server_itl_ms": server_mean * 1e3,
              "server_over_client_itl_ratio": server_mean / client_mean,
              "client_itl_p99_ms": client_p99 * 1e3, "server_itl_p99_ms": server_p99 * 1e3,
              "server_over_client_itl_p99_ratio": server_p99 / client_p99,
              "itl_count_ratio": count / len(client)}
    for edge in _OVER_EDGES_S:
        client_over = sum(1 for g in client if g > edge) / len(client)
        server_over = (count - diff[edge]) / count
        ms = f"{edge * 1e3:g}"
        print(f"tbt: gaps over {ms} ms: {client_over:.4%} client, {server_over:.4%} server")
        fields |= {f"client_over_{ms}ms": client_over, f"server_over_{ms}ms": server_over}
    return fields


def _sdk_split(ttfts: _Ttfts, server_s: float) -> dict[str, float]:
    """The openai client's TTFT in three parts, all stamped in its own process."""
    before = statistics.fmean(sent for sent, _, _ in ttfts.stamped)
    wire = statistics.fmean(bytes_at - sent for sent, bytes_at, _ in ttfts.stamped)
    parse = statistics.fmean(first - bytes_at for _, bytes_at, first in ttfts.stamped)
    print(f"ttft: inside the openai client ({len(ttfts.stamped)} of {len(ttfts.first)} "
          f"requests stamped): {before * 1e3:.2f} ms before the request reaches "
          f"httpx, {wire * 1e3:.2f} ms until the first text event's bytes arrive (the server "
          f"stamps {server_s * 1e3:.2f} ms: {(wire - server_s) * 1e3:+.2f} ms), "
          f"{parse * 1e3:.2f} ms parsing it into a chunk")
    return {"sdk_before_send_ms": before * 1e3, "client_wire_ttft_ms": wire * 1e3,
            "server_client_wire_gap_ms": (wire - server_s) * 1e3,
            "server_over_client_wire_ratio": server_s / wire,
            "sdk_parse_first_ms": parse * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="idle,tokenize,ttft,tbt")
    ap.add_argument("--requests", type=int, default=20, help="idle: requests per mode")
    ap.add_argument("--pause", type=float, default=1.0, help="idle: seconds between")
    ap.add_argument("--streams", type=int, default=4, help="tokenize: running streams")
    ap.add_argument("--prompt-mb", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=12.0, help="ttft: requests per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="ttft: how long")
    ap.add_argument("--tbt-logprobs", type=int, default=None,
                    help="tbt: top logprobs each stream asks for (loads the server's "
                         "event loop)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    fields: dict[str, float] = {}
    if "idle" in parts:
        fields |= part_idle(args.requests, args.pause)
    if "tokenize" in parts:
        fields |= part_tokenize(args.streams, args.prompt_mb, base_s=4.0)
    if "ttft" in parts:
        fields |= part_ttft(args.rate, args.seconds)
    if "tbt" in parts:
        fields |= part_tbt(args.rate, args.seconds, logprobs=args.tbt_logprobs)
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
