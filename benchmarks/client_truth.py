"""The server's TTFT, gaps and verdicts against two clients nobody here wrote the timing of.

``slopilot serve`` (simulated executor, real time) judges each request by ``--slo``
and exports its histograms and verdicts. Two clients measure the same requests on
their own side, each as its own users measure:

- ``vllm``: as ``vllm bench serve`` does (``vllm/benchmarks/lib/endpoint_request_func``,
  ``async_request_openai_completions`` / ``_chat_completions``): aiohttp, SSE messages
  split on blank lines; TTFT at the first message with ``choices`` (its text may be
  empty), one ITL for every later message with ``choices``, TPOT = (latency - TTFT) /
  (output tokens - 1), the output tokens from the stream's usage;
- ``openai``: the ``openai`` SDK's user: TTFT at the first chunk with non-empty content
  (``text``, or ``delta.content``), gaps between the chunks with content.

Each (client, endpoint) pair is one phase: an open-loop Poisson load (``--rate`` for
``--seconds``, at most ``--max-requests``), 70 % short prompts and 30 % long, so that
requests queue; the server is scraped before and after, so its figures cover the
phase's requests only. Per phase it prints TTFT and gap p50/p90/p99 as the client
measured them (exact, and on the server's bucket edges: the buckets' share of the
error), as the server's histograms give them (``histogram_quantile`` on the bucket
increase, a 429 in TTFT's +Inf: ``rules.bucket_rates``), and the requests the server
judged met against the ones the client would (``ClassSLO.met`` on its own TTFT and
gaps; a 429 missed). ``--runs`` repeats every phase; errors are medians over runs.

The ``kernel`` part times what a request waits in the server's kernel before its event
loop reads it, which the client's TTFT counts and a stamp taken at the read did not
(``engine/tcp_received.py``): ``vllm``'s client on completions, each phase its own
server scrape, the server's TTFT its histogram's sum over count (exact) and its
P50/P90 (``histogram_quantile``) against the client's mean and exact quantiles (and its
samples on the server's edges, ``bucketed``: the buckets' share of the error); and the
mean against the client's on the wire (``wire``: less the client's own time, which no
server sees, before the request was all in its socket, connecting and its loop busy,
``written``, and after its kernel got the first chunk, ``read lag``: ``tcp_received`` on
the client's socket, at least that); ``sent``: the mean less ``written`` only.

- ``burst``: ``--burst`` streams, each on a connection of its own, opened at once: the
  loop, busy accepting and parsing them and streaming the first ones' tokens, leaves the
  later ones in the accept queue and their sockets;
- ``stop_new`` / ``stop_kept``: the server's processes stopped (SIGSTOP) for
  ``--stop-s`` while ``--stop-requests`` streams are sent, evenly over the stop, on new
  connections (the accept queue) or on kept-alive ones (their sockets' receive queues),
  then let go on (SIGCONT);
- ``upload``: ``--upload-requests`` streams at once, each on a raw connection (h11 over
  asyncio streams) sending its head and half its body, pausing ``--upload-pause-s``,
  then the rest: its ``written`` is the pause, so its mean's error is against the
  client's TTFT from its first byte sent (the upload, which the server no longer
  counts, in it: strongly negative) and its ``sent`` one against its TTFT from its last
  byte sent (``wire``: less its read lag too).

Each phase runs against this tree's server and, unless ``--no-read-stamp``, against one
whose stamps are taken at the read (``http_arrival.connection_lag`` answering None: the
stamp before ``tcp_received``), a server of its own; and, unless ``--no-meter``, through
this tree's ``slopilot meter`` (``--priority-class p1``) in front of a server of this
tree's, where two rows read the same requests: ``meter``, the meter's client-side TTFT
(``slopilot_client_time_to_first_token_seconds``, stamped at its own arrival, backdated
by its kernel's wait), and ``behind``, the server's behind it (stamped when the meter
forwarded: the meter's time and a wait in the meter's kernel are not in it). A stop
phase there stops both processes, so its requests wait in the meter's kernel.

    .venv/bin/python benchmarks/client_truth.py [--rate 12] [--seconds 15] [--runs 3]
        [--logprobs N] [--set KNOB=VALUE] [--ttft-ms 400] [--tbt-ms 40]
        [--parts poisson,kernel] [--burst 120] [--stop-s 1.0] [--stop-requests 8]
        [--upload-requests 8] [--upload-pause-s 0.5] [--no-read-stamp] [--no-meter]

Ends with ``RESULT key=value ...``: per endpoint and client, the median relative
errors (server - client) / client; for the kernel part, per phase and row (``kernel``,
``read``, ``meter``, ``behind``), the median relative errors of the server's (the
meter's) mean (against the client's, from its last byte sent, and on the wire), P50 and
P90 TTFT (the client's exact, and on the server's edges).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import h11
import httpx
import httpx2
import openai
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_quantile, latency_quantile
from slopilot.engine.meter.client_latency import CLIENT_TTFT
from slopilot.engine.metric_names import REFUSED
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.engine.tcp_received import since_last_data
from slopilot.engine.verdicts import SLO_REQUESTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loop_truth import percentile, relative_error  # noqa: E402
from meter_truth import meter  # noqa: E402
from serving_latency import serve  # noqa: E402
from stall_process import process_tree, signal_all  # noqa: E402

CLASS = "p1"  # what a request without a priority is served as
SLO: dict[str, dict[str, dict[str, float]]] = {
    "classes": {CLASS: {"ttftP99Ms": 400, "tbtP99Ms": 40}}}
QUANTILES = (0.5, 0.9, 0.99)
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"


@dataclass
class Measured:
    """One request as its client measured it."""

    status: str = "failed"  # ok, refused (429), failed
    ttft: float = math.nan
    itl: list[float] = field(default_factory=list)
    latency: float = math.nan
    output_tokens: int = 0
    written: float = math.nan
    """Seconds from the call to the request's last bytes handed to the socket (the
    kernel part's ``vllm`` client only): the client's own time before the server can
    see all of it."""
    read_lag: float = math.nan
    """Seconds the client read its first body bytes after its kernel got the newest of
    them (``tcp_received``; the kernel part's ``vllm`` client only): at least its own
    time after the server's first chunk, which the server cannot see either. At least:
    a later chunk arrived before the read makes it read short."""

    @property
    def tpot(self) -> float:
        """vLLM's TPOT: the time after the first token over the tokens after it."""
        if self.output_tokens <= 1:
            return math.nan
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def met(self, slo: ClassSLO) -> bool:
        if self.status != "ok" or math.isnan(self.ttft):
            return False
        over = sum(1 for g in self.itl if slo.tbt_p99_ms is not None
                   and g > slo.tbt_p99_ms / 1000.0)
        return slo.met(self.ttft, len(self.itl), over)


class SSEMessages:
    """SSE messages out of a byte stream, as vLLM's benchmark splits them: on a blank
    line, and a last message without one once it is a whole JSON object or [DONE]."""

    def __init__(self) -> None:
        self.buffer = ""

    def add(self, data: bytes) -> list[str]:
        self.buffer += data.decode()
        out = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            if message.strip():
                out.append(message.strip())
        rest = self.buffer.strip()
        if rest.startswith("data: "):
            body = rest.removeprefix("data: ").strip()
            try:
                if body == "[DONE]" or json.loads(body) is not None:
                    out.append(rest)
                    self.buffer = ""
            except json.JSONDecodeError:
                pass  # not whole yet
        return out


def vllm_timings(messages: list[tuple[float, str]], sent: float) -> Measured:
    """``vllm bench serve``'s figures from the SSE messages a stream brought and when:
    TTFT at the first with choices, an ITL for every later one with choices, the latency
    at the last with choices, the output tokens from the usage."""
    m = Measured(status="ok")
    last = sent
    for at, message in messages:
        if message.startswith(":"):
            continue
        body = message.removeprefix("data: ")
        if body == "[DONE]":
            continue
        data = json.loads(body)
        if data.get("choices"):
            if math.isnan(m.ttft):
                m.ttft = at - sent
            else:
                m.itl.append(at - last)
            last = at
        elif usage := data.get("usage"):
            m.output_tokens = int(usage.get("completion_tokens") or 0)
    m.latency = last - sent
    if math.isnan(m.ttft):
        m.status = "failed"
    return m


def logprobs_fields(chat: bool, logprobs: int | None) -> dict[str, object]:
    """The request's fields for ``logprobs`` top logprobs a token (none for None)."""
    if logprobs is None:
        return {}
    return {"logprobs": True, "top_logprobs": logprobs} if chat else {"logprobs": logprobs}


async def vllm_request(session: aiohttp.ClientSession, url: str, model: str, chat: bool,
                       prompt: str, max_tokens: int, logprobs: int | None,
                       traced: bool = False) -> Measured:
    payload: dict[str, object] = {"model": model, "stream": True, "ignore_eos": True,
                                  "stream_options": {"include_usage": True},
                                  **logprobs_fields(chat, logprobs)}
    if chat:
        payload |= {"messages": [{"role": "user", "content": prompt}],
                    "max_completion_tokens": max_tokens}
    else:
        payload |= {"prompt": prompt, "max_tokens": max_tokens}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    messages: list[tuple[float, str]] = []
    sse = SSEMessages()
    trace: dict[str, float] = {}  # WRITTEN, in a session of ``vllm_session``'s
    sent = time.perf_counter()
    try:
        async with session.post(url + path, json=payload,
                                trace_request_ctx=trace if traced else None) as resp:
            if resp.status == 429:
                return Measured(status="refused")
            if resp.status != 200:
                return Measured()
            sock = (resp.connection.transport.get_extra_info("socket")
                    if traced and resp.connection and resp.connection.transport else None)
            async for data in resp.content.iter_any():
                if sock is not None:  # the first body bytes: how late the client read them
                    trace[READ_LAG] = since_last_data(sock) or math.nan
                    sock = None
                data = data.strip()
                if data:
                    for message in sse.add(data):
                        messages.append((time.perf_counter(), message))
    except (TimeoutError, aiohttp.ClientError):
        return Measured()  # as vLLM's client counts it: failed
    m = vllm_timings(messages, sent)
    m.written = trace.get(WRITTEN, math.nan) - sent
    m.read_lag = trace.get(READ_LAG, math.nan)
    return m


async def openai_request(client: openai.AsyncOpenAI, model: str, chat: bool, prompt: str,
                         max_tokens: int, logprobs: int | None) -> Measured:
    m = Measured(status="ok")
    last = math.nan
    sent = time.perf_counter()
    try:
        if chat:
            stream: openai.AsyncStream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True, **logprobs_fields(chat, logprobs)})
        else:
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True, **logprobs_fields(chat, logprobs)})
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            text = choice.delta.content if chat else choice.text
            if not text:
                continue
            now = time.perf_counter()
            if math.isnan(m.ttft):
                m.ttft = now - sent
            else:
                m.itl.append(now - last)
            last = now
            m.output_tokens += 1
    except openai.RateLimitError:
        return Measured(status="refused")
    except openai.APIConnectionError:
        # A keep-alive connection the server closed as it was reused (uvicorn's 5 s
        # idle timeout, as vLLM's): the SDK retries it by default; with no retries, as
        # here, its user has an error, and the server never had the request.
        return Measured()
    m.latency = last - sent
    if math.isnan(m.ttft):
        m.status = "failed"
    return m


Request = Callable[[str, int], Coroutine[Any, Any, Measured]]


async def poisson(request: Request, rate: float, seconds: float, max_requests: int,
                  seed: int) -> list[Measured]:
    """Open-loop Poisson arrivals over ``seconds`` (at most ``max_requests``): 70 % of
    prompts 30 words, 30 % 600, 48 tokens out, each prompt's words its own (a prompt
    the prefix cache holds is prefilled free)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Measured]] = []
    t0 = time.perf_counter()
    due = 0.0
    while due < seconds and len(tasks) < max_requests:
        delay = t0 + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        words = 600 if rng.random() < 0.3 else 30
        prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))
        tasks.append(asyncio.create_task(request(prompt, 48)))
        due += rng.expovariate(rate)
    return list(await asyncio.gather(*tasks))


async def phase(url: str, model: str, tool: str, chat: bool, args: argparse.Namespace,
                seed: int) -> list[Measured]:
    timeout = 120.0
    if tool == "vllm":
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(
                total=timeout)) as session:
            return await poisson(
                lambda p, n: vllm_request(session, url, model, chat, p, n, args.logprobs),
                args.rate, args.seconds, args.max_requests, seed)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=timeout,
                                http_client=openai.DefaultAsyncHttpxClient(
                                    limits=httpx2.Limits(max_connections=None)))
    async with client:
        return await poisson(
            lambda p, n: openai_request(client, model, chat, p, n, args.logprobs),
            args.rate, args.seconds, args.max_requests, seed)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if dict(s.labels).get("priority_class", CLASS) == CLASS}


def total(d: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in d.items()
               if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def buckets(d: Samples, name: str, never: float = 0.0) -> dict[float, float]:
    """Cumulative ``{le: count}`` of ``name``; ``never`` more in +Inf (the rules count a
    429 there for TTFT)."""
    out: dict[float, float] = {}
    for (n, lab), v in d.items():
        if n == name + "_bucket":
            le = float(dict(lab)["le"])
            out[le] = out.get(le, 0.0) + v
    out[math.inf] = out.get(math.inf, 0.0) + never
    return out


def compare(records: list[Measured], before: Samples, after: Samples,
            slo: ClassSLO) -> dict[str, float]:
    """The client's figures, the server's, and their errors, for one phase."""
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}
    ok = [r for r in records if r.status == "ok"]
    refused = sum(1 for r in records if r.status == "refused")
    server_refused = total(d, REFUSED)
    out: dict[str, float] = {
        "requests": len(records), "ok": len(ok), "refused": refused,
        "failed": len(records) - len(ok) - refused,
        "server_ttft_count": total(d, TTFT + "_count"),
        "server_e2e_count": total(d, E2E + "_count"), "server_refused": server_refused,
        "itl_count": sum(len(r.itl) for r in ok),
        "server_itl_count": total(d, ITL + "_count"),
        "tokens": sum(r.output_tokens for r in ok),
        "tpot_ms": statistics.median(r.tpot for r in ok if not math.isnan(r.tpot)) * 1e3}
    ttfts = [r.ttft for r in ok]
    gaps = [g for r in ok for g in r.itl]
    for short, client, hist, never in (("ttft", ttfts, buckets(d, TTFT, server_refused),
                                        refused), ("itl", gaps, buckets(d, ITL), 0)):
        exact = client + [math.inf] * never
        for q in QUANTILES:
            key = f"{short}_p{round(q * 100)}"
            c = percentile(exact, q) * 1e3
            cb = latency_quantile(q, client, never) * 1e3
            s = histogram_quantile(q, hist) * 1e3
            out |= {f"{key}_client_ms": c, f"{key}_bucketed_ms": cb, f"{key}_server_ms": s,
                    f"{key}_err": relative_error(s, c),
                    f"{key}_bucketed_err": relative_error(s, cb)}
    server_met = total(d, SLO_REQUESTS, met="true")
    server_judged = total(d, SLO_REQUESTS)
    client_met = sum(1 for r in records if r.met(slo))
    out |= {"server_met": server_met, "server_judged": server_judged,
            "client_met": client_met,
            "met_share_err": relative_error(server_met / server_judged if server_judged
                                            else math.nan, client_met / len(records))}
    return out


def show(name: str, f: dict[str, float]) -> None:
    print(f"\n{name}: {f['requests']:.0f} requests ({f['ok']:.0f} served, "
          f"{f['refused']:.0f} refused, {f['failed']:.0f} failed); the server counted "
          f"{f['server_ttft_count']:.0f} first tokens, {f['server_e2e_count']:.0f} ends, "
          f"{f['server_refused']:.0f} refused; gaps client {f['itl_count']:.0f} / server "
          f"{f['server_itl_count']:.0f}; {f['tokens']:.0f} tokens; TPOT "
          f"{f['tpot_ms']:.1f} ms")
    print(f"{'':10} {'client':>9} {'bucketed':>9} {'server':>9} {'err':>8} {'err/bucketed':>13}")
    for short in ("ttft", "itl"):
        for q in QUANTILES:
            key = f"{short}_p{round(q * 100)}"
            print(f"{key:10} {f[key + '_client_ms']:9.1f} {f[key + '_bucketed_ms']:9.1f} "
                  f"{f[key + '_server_ms']:9.1f} {f[key + '_err']:+8.1%} "
                  f"{f[key + '_bucketed_err']:+13.1%}")
    print(f"met the SLO: server {f['server_met']:.0f} of {f['server_judged']:.0f} judged, "
          f"client {f['client_met']:.0f} of {f['requests']:.0f} "
          f"(share error {f['met_share_err']:+.1%})")


# The server of before tcp_received, for the kernel part: each request stamped when its
# bytes were read (the connection's lag never asked), all else this tree's.
READ_STAMP_SERVE = r"""
import sys
import slopilot.engine.http_arrival as arrival
from slopilot.cli import main
arrival.connection_lag = lambda transport: None
sys.exit(main(sys.argv[1:]))
"""
STAMPS = (("kernel", ("-m", "slopilot.cli")), ("read", ("-c", READ_STAMP_SERVE)))
KERNEL_PHASES = ("burst", "stop_new", "stop_kept", "upload")
KERNEL_COLUMNS = ("ttft_mean", "ttft_sent", "ttft_wire", "ttft_p50", "ttft_p90")
KERNEL_KEYS = (*KERNEL_COLUMNS, "ttft_p50_bucketed", "ttft_p90_bucketed")
KERNEL_REPORTED = tuple(f"{k}_err" for k in KERNEL_KEYS)


def prompts(n: int, seed: int) -> list[str]:
    """``n`` prompts as ``poisson`` draws them: 70 % 30 words, 30 % 600, each its own."""
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(10**6)}" for _ in range(600 if rng.random() < 0.3
                                                               else 30))
            for _ in range(n)]


def spread(n: int, seconds: float) -> list[float]:
    """``n`` offsets evenly inside ``seconds``: the middles of ``n`` equal slices, so the
    first is sent after the stop began and the last before it ends."""
    return [seconds * (i + 0.5) / n for i in range(n)]


def kernel_compare(records: list[Measured], before: Samples, after: Samples,
                   metric: str = TTFT) -> dict[str, float]:
    """A kernel phase's TTFT, the client's and the server's (``metric``: the server's
    histogram, or the meter's ``CLIENT_TTFT``): the mean (the histogram's sum over count,
    exact) and P50/P90 (its buckets' ``histogram_quantile``), with their errors
    (server - client) / client."""
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}
    ttfts = [r.ttft for r in records if r.status == "ok"]
    count = total(d, metric + "_count")
    out: dict[str, float] = {
        "requests": len(records), "ok": len(ttfts), "server_count": count,
        "ttft_mean_client_ms": statistics.fmean(ttfts) * 1e3 if ttfts else math.nan,
        "ttft_mean_server_ms": total(d, metric + "_sum") / count * 1e3 if count else math.nan,
        "written_mean_ms": statistics.fmean(r.written for r in records if r.status == "ok")
        * 1e3 if ttfts else math.nan}
    # The client's TTFT on the wire: less what no server can see of it, the client's
    # own time (connecting, its loop busy) before the request was all in its socket and
    # after its first chunk reached the client's kernel (as far as its kernel tells).
    out["read_lag_mean_ms"] = (statistics.fmean(
        0.0 if math.isnan(r.read_lag) else r.read_lag for r in records if r.status == "ok")
        * 1e3 if ttfts else math.nan)
    out["ttft_wire_client_ms"] = (out["ttft_mean_client_ms"] - out["written_mean_ms"]
                                  - out["read_lag_mean_ms"])
    out["ttft_wire_server_ms"] = out["ttft_mean_server_ms"]
    # From its last byte written (the moment the server now stamps, less the wire): the
    # upload phase's, whose read lag is a kernel tick or two at most.
    out["ttft_sent_client_ms"] = out["ttft_mean_client_ms"] - out["written_mean_ms"]
    out["ttft_sent_server_ms"] = out["ttft_mean_server_ms"]
    hist = buckets(d, metric)
    edges = sorted(e for e in hist if not math.isinf(e))
    for q in QUANTILES[:2]:
        key = f"ttft_p{round(q * 100)}"
        server = histogram_quantile(q, hist) * 1e3 if count else math.nan
        out |= {f"{key}_client_ms": percentile(ttfts, q) * 1e3, f"{key}_server_ms": server,
                # The client's own samples on the server's edges: what of the error is
                # the buckets' (a few samples in a bucket 10 % wide).
                f"{key}_bucketed_client_ms": latency_quantile(q, ttfts, edges=edges) * 1e3,
                f"{key}_bucketed_server_ms": server}
    for key in KERNEL_KEYS:
        out[f"{key}_err"] = relative_error(out[f"{key}_server_ms"], out[f"{key}_client_ms"])
    return out


def server_processes() -> list[int]:
    """The server this process started (its one child) and the server's own children."""
    return process_tree(os.getpid())[1:]


WRITTEN, READ_LAG = "written", "read_lag"


async def _chunk_sent(session: aiohttp.ClientSession, ctx: Any,
                      params: aiohttp.TraceRequestChunkSentParams) -> None:
    # Just before the chunk's write: aiohttp holds the head back and writes it with the
    # body's first chunk, so the last chunk's is when the request is all in the socket.
    if ctx.trace_request_ctx is not None:
        ctx.trace_request_ctx[WRITTEN] = time.perf_counter()


def vllm_session(new_connections: bool) -> aiohttp.ClientSession:
    """vLLM's client's session, timing when each ``traced`` request was written."""
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_chunk_sent)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=new_connections),
        timeout=aiohttp.ClientTimeout(total=120.0), trace_configs=[trace])


def scrape_all(urls: Sequence[str]) -> list[Samples]:
    return [scrape(u) for u in urls]


async def burst(url: str, model: str, n: int, seed: int, scraped: Sequence[str] = ()
                ) -> tuple[list[Samples], list[Measured]]:
    """``n`` streams at once, each on a new connection; the scrapes of ``scraped``
    before them."""
    before = await asyncio.to_thread(scrape_all, scraped)
    async with vllm_session(new_connections=True) as session:
        return before, list(await asyncio.gather(*(
            vllm_request(session, url, model, False, p, 48, None, traced=True)
            for p in prompts(n, seed))))


async def stopped(url: str, model: str, n: int, stop_s: float, new_connections: bool,
                  seed: int, scraped: Sequence[str]) -> tuple[list[Samples], list[Measured]]:
    """``n`` streams sent evenly over ``stop_s`` while the processes this one started
    (the server, and the meter in front of it) are stopped: on new connections (they
    wait in the accept queue), or on connections kept alive from ``n`` requests before
    (their bytes wait in the sockets); the scrapes of ``scraped`` before them (after
    those ``n``)."""
    async with vllm_session(new_connections) as session:
        if not new_connections:  # n connections open and idle in the pool
            await asyncio.gather(*(vllm_request(session, url, model, False, "warm", 1, None)
                                   for _ in range(n)))
        before = await asyncio.to_thread(scrape_all, scraped)
        procs = server_processes()
        tasks: list[asyncio.Task[Measured]] = []
        signal_all(procs, signal.SIGSTOP)
        try:
            t0 = time.perf_counter()
            for at, prompt in zip(spread(n, stop_s), prompts(n, seed), strict=True):
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                tasks.append(asyncio.create_task(
                    vllm_request(session, url, model, False, prompt, 48, None, traced=True)))
            await asyncio.sleep(max(0.0, t0 + stop_s - time.perf_counter()))
        finally:
            signal_all(procs, signal.SIGCONT)  # never a server left stopped
        return before, list(await asyncio.gather(*tasks))


def upload_pieces(conn: h11.Connection, host: str, payload: dict[str, object],
                  share: float = 0.5) -> tuple[bytes, bytes]:
    """A completions request on ``conn`` (a client's, left awaiting the response) in
    two pieces: its head with the first ``share`` of its JSON body, then the rest."""
    body = json.dumps(payload).encode()
    head = conn.send(h11.Request(method="POST", target="/v1/completions", headers=[
        ("Host", host), ("Content-Type", "application/json"),
        ("Content-Length", str(len(body)))])) or b""
    data = conn.send(h11.Data(data=body)) or b""  # Content-Length: the body as is
    conn.send(h11.EndOfMessage())
    cut = int(len(data) * share)
    return head + data[:cut], data[cut:]


class UploadResponse:
    """An upload stream's response as the client's reads bring it (h11's client side
    on ``conn``): vLLM's client's figures once it ends, with the read lag at the read
    that brought its first body bytes."""

    def __init__(self, conn: h11.Connection, sent: float, written: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.conn, self.sent, self.written, self.clock = conn, sent, written, clock
        self.messages: list[tuple[float, str]] = []
        self.sse = SSEMessages()
        self.read_lag = math.nan
        self.lag_taken = False

    def add(self, data: bytes, lag: float | None) -> Measured | None:
        """One read's ``data`` (b"": the connection closed), ``lag`` the kernel's
        ``since_last_data`` just after it; the stream's figures once it ended."""
        conn = self.conn
        conn.receive_data(data)
        while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.Response) and event.status_code != 200:
                return Measured(status="refused" if event.status_code == 429
                                else "failed")
            if isinstance(event, h11.Data):
                if not self.lag_taken:  # as vllm_request: the first body bytes' only
                    # A 0 read (within the kernel's tick) is taken too: it used to read as
                    # not taken, and a later read's first nonzero lag (one tick) stood in.
                    self.lag_taken = True
                    self.read_lag = math.nan if lag is None else lag
                now = self.clock()
                self.messages.extend((now, m) for m in self.sse.add(bytes(event.data)))
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                m = vllm_timings(self.messages, self.sent)
                m.written, m.read_lag = self.written - self.sent, self.read_lag
                return m
        if not data:
            return Measured()  # closed before the response ended
        return None


async def upload_request(url: str, model: str, prompt: str, pause_s: float) -> Measured:
    """One stream whose upload pauses ``pause_s`` mid-body, vLLM's client's figures:
    TTFT from its first byte sent, ``written`` from it to its last byte's write."""
    split = urllib.parse.urlsplit(url)
    conn = h11.Connection(h11.CLIENT)
    first, rest = upload_pieces(conn, split.netloc, {
        "model": model, "prompt": prompt, "max_tokens": 48, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True}})
    reader, writer = await asyncio.open_connection(split.hostname, split.port)
    sock = writer.get_extra_info("socket")
    try:
        sent = time.perf_counter()
        writer.write(first)
        await writer.drain()
        await asyncio.sleep(pause_s)
        written = time.perf_counter()
        writer.write(rest)
        await writer.drain()
        response = UploadResponse(conn, sent, written)
        while True:
            data = await reader.read(65536)
            if (m := response.add(data, since_last_data(sock) if data else None)) is not None:
                return m
    except (OSError, h11.ProtocolError):
        return Measured()
    finally:
        writer.close()


async def upload(url: str, model: str, n: int, pause_s: float, seed: int,
                 scraped: Sequence[str]) -> tuple[list[Samples], list[Measured]]:
    """``n`` streams at once, each pausing its upload ``pause_s`` mid-body; the scrapes
    of ``scraped`` before them."""
    before = await asyncio.to_thread(scrape_all, scraped)
    return before, list(await asyncio.gather(*(
        upload_request(url, model, p, pause_s) for p in prompts(n, seed))))


def kernel_phase(name: str, url: str, model: str, args: argparse.Namespace,
                 seed: int, scraped: Sequence[str]) -> tuple[list[Samples], list[Measured]]:
    """A kernel phase's scrapes of ``scraped`` before its requests (sent to ``url``),
    and its requests as measured."""
    if name == "burst":
        return asyncio.run(burst(url, model, args.burst, seed, scraped))
    if name == "upload":
        return asyncio.run(upload(url, model, args.upload_requests, args.upload_pause_s,
                                  seed, scraped))
    return asyncio.run(stopped(url, model, args.stop_requests, args.stop_s,
                               name == "stop_new", seed, scraped))


def show_kernel(name: str, f: dict[str, float]) -> None:
    print(f"{name:32} {f['requests']:4.0f} {f['ok']:4.0f} {f['server_count']:6.0f}"
          + "".join(f" {f[k + '_client_ms']:17.1f} {f[k + '_server_ms']:8.1f} "
                    f"{f[k + '_err']:+7.1%}" for k in KERNEL_COLUMNS)
          + f" {f['written_mean_ms']:8.1f} {f['read_lag_mean_ms']:8.1f}")


@dataclass(frozen=True)
class Reading:
    """A TTFT histogram a kernel phase's requests are read from: one row of each
    phase's (``PHASE_ROW`` in the RESULT keys)."""

    row: str
    """kernel, read: a server's, its stamp; meter: the meter's client-side histogram;
    behind: the server's behind the meter."""
    url: str
    metric: str


def kernel_part(args: argparse.Namespace, knobs: list[str], slo_file: Path,
                result: dict[str, float]) -> None:
    stamps = STAMPS if args.read_stamp else STAMPS[:1]
    figures: dict[str, list[dict[str, float]]] = {}
    print(f"\nkernel part, completions, vllm's client; TTFT ms: client, server (meter "
          f"rows: the meter), (server - client) / client\n{'':32} {'reqs':>4} {'ok':>4} "
          f"{'server':>6}"
          + "".join(f" {k.removeprefix('ttft_') + ' client':>17} {'server':>8} {'err':>7}"
                    for k in KERNEL_COLUMNS) + f" {'written':>8} {'read lag':>8}")
    for stamp, launcher in stamps:
        with serve("--executor", "simulated", "--slo", str(slo_file), *knobs,
                   launcher=launcher) as url:
            kernel_runs(args, url, model_of(url), (Reading(stamp, url, TTFT),), figures)
    if args.meter:
        # This tree's meter in front of this tree's server, the client's requests
        # through it: the meter's TTFT (its stamp, backdated by its kernel's wait)
        # against the client's, and the server's behind it, which a wait in the meter
        # precedes (its stamp when the meter forwarded).
        with serve("--executor", "simulated", "--slo", str(slo_file), *knobs) as url, \
                meter(url, slo_file, flags=("--priority-class", CLASS)) as metered:
            kernel_runs(args, metered.url, model_of(url),
                        (Reading("meter", metered.url, CLIENT_TTFT),
                         Reading("behind", url, TTFT)), figures)
    result |= medians(figures, KERNEL_REPORTED, args.runs, width=19)


def model_of(url: str) -> str:
    model: str = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    return model


def kernel_runs(args: argparse.Namespace, url: str, model: str,
                readings: Sequence[Reading], figures: dict[str, list[dict[str, float]]]
                ) -> None:
    """Every kernel phase ``--runs`` times, its requests sent to ``url``, each of
    ``readings`` its row (``figures[PHASE_ROW]``, a run each)."""
    scraped = [r.url for r in readings]
    asyncio.run(burst(url, model, 8, -1))  # warm up
    for run in range(args.runs):
        for i, name in enumerate(KERNEL_PHASES):
            seed = args.seed * 1000 + 500 + run * len(KERNEL_PHASES) + i
            befores, records = kernel_phase(name, url, model, args, seed, scraped)
            afters = scrape_all(scraped)
            for reading, before, after in zip(readings, befores, afters, strict=True):
                f = kernel_compare(records, before, after, reading.metric)
                show_kernel(f"run {run + 1}, {name}, {reading.row}", f)
                figures.setdefault(f"{name}_{reading.row}", []).append(f)


def medians(figures: dict[str, list[dict[str, float]]], reported: tuple[str, ...],
            runs: int, *, width: int) -> dict[str, float]:
    """Each phase's median over its runs of each reported error, printed as a table and
    returned as RESULT keys (``PHASE_KEY``)."""
    print(f"\nmedians over {runs} runs, (server - client) / client")
    print(f"{'':20}" + "".join(f"{k.removesuffix('_err'):>{width}}" for k in reported))
    out: dict[str, float] = {}
    for name, ran in figures.items():
        row = {k: statistics.median(f[k] for f in ran) for k in reported}
        print(f"{name:20}" + "".join(f"{v:+{width}.1%}" for v in row.values()))
        out |= {f"{name}_{k}": v for k, v in row.items()}
    return out


PHASES = (("completions", False), ("chat", True))
TOOLS = ("vllm", "openai")
REPORTED = ("ttft_p50_err", "ttft_p90_err", "ttft_p99_err", "ttft_p99_bucketed_err",
            "itl_p50_err", "itl_p90_err", "itl_p99_err", "itl_p99_bucketed_err",
            "met_share_err")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=12.0, help="requests per second")
    ap.add_argument("--seconds", type=float, default=15.0, help="a phase's arrivals")
    ap.add_argument("--max-requests", type=int, default=400, help="a phase's at most")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--logprobs", type=int, default=None, metavar="N",
                    help="ask N top logprobs a token: the server's event loop formats them "
                    "into every chunk, and a busy loop writes chunks of several tokens")
    ap.add_argument("--set", action="append", metavar="KNOB=VALUE",
                    help="the server's knobs (default max_num_seqs=16: requests queue; the "
                    "kernel part's 256: a burst's streams all run)")
    ap.add_argument("--ttft-ms", type=float, default=SLO["classes"][CLASS]["ttftP99Ms"],
                    help="the SLO's TTFT target, both sides judge by it")
    ap.add_argument("--tbt-ms", type=float, default=SLO["classes"][CLASS]["tbtP99Ms"],
                    help="the SLO's TBT target, both sides judge by it")
    ap.add_argument("--parts", default="poisson,kernel",
                    help="poisson (each client and endpoint under Poisson load, ~4-12 "
                    "min), kernel (the kernel's wait: a burst, a stopped server, a paused upload; "
                    "the servers, then the meter in front of one, ~2.5 min)")
    ap.add_argument("--burst", type=int, default=120,
                    help="the kernel part's streams opened at once, each its connection")
    ap.add_argument("--stop-s", type=float, default=1.0,
                    help="the kernel part's time the server stays stopped")
    ap.add_argument("--stop-requests", type=int, default=8,
                    help="the kernel part's streams sent while the server is stopped")
    ap.add_argument("--upload-requests", type=int, default=8,
                    help="the kernel part's streams whose uploads pause mid-body")
    ap.add_argument("--upload-pause-s", type=float, default=0.5,
                    help="the kernel part's pause in each upload, client side")
    ap.add_argument("--no-read-stamp", dest="read_stamp", action="store_false",
                    help="skip the kernel part's server stamping at the read")
    ap.add_argument("--no-meter", dest="meter", action="store_false",
                    help="skip the kernel part's meter in front of a server")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts or not parts <= {"poisson", "kernel"}:
        ap.error(f"--parts {args.parts!r}: give poisson, kernel or both, comma-separated")
    spec = {"classes": {CLASS: {"ttftP99Ms": args.ttft_ms, "tbtP99Ms": args.tbt_ms}}}
    slo = SLOSpec.from_dict(spec).class_slo(CLASS)
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        slo_file = Path(tmp) / "slo.json"
        slo_file.write_text(json.dumps(spec))
        if "poisson" in parts:
            knobs = [a for k in args.set or ["max_num_seqs=16"] for a in ("--set", k)]
            poisson_part(args, knobs, slo_file, slo, result)
        if "kernel" in parts:
            # The burst's streams all running at once: their TTFT the loop's and the
            # kernel's wait more than the engine's queue (which the server sees).
            knobs = [a for k in args.set or ["max_num_seqs=256"] for a in ("--set", k)]
            kernel_part(args, knobs, slo_file, result)
    print("RESULT " + " ".join(f"{k}={v:+.4f}" for k, v in result.items()))
    return 0


def poisson_part(args: argparse.Namespace, knobs: list[str], slo_file: Path,
                 slo: ClassSLO, result: dict[str, float]) -> None:
    figures: dict[str, list[dict[str, float]]] = {}
    with serve("--executor", "simulated", "--slo", str(slo_file), *knobs) as url:
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        asyncio.run(phase(url, model, "vllm", False, argparse.Namespace(
            rate=args.rate, seconds=2.0, max_requests=20, logprobs=None),
            -1))  # warm up
        for run in range(args.runs):
            for i, (endpoint, chat, tool) in enumerate(
                    (e, c, t) for e, c in PHASES for t in TOOLS):
                before = scrape(url)
                # A seed of its own: a prompt an earlier phase sent is in the prefix
                # cache, and its TTFT would be a hit's.
                seed = args.seed * 1000 + run * len(TOOLS) * len(PHASES) + i
                records = asyncio.run(phase(url, model, tool, chat, args, seed))
                f = compare(records, before, scrape(url), slo)
                show(f"run {run + 1}, {endpoint}, {tool}", f)
                figures.setdefault(f"{endpoint}_{tool}", []).append(f)
    result |= medians(figures, REPORTED, args.runs, width=20)


if __name__ == "__main__":
    sys.exit(main())
