"""What a /metrics scrape costs the token streams of the server it scrapes.

The built-in engine's server renders its Prometheus text on the event loop that writes
every stream's chunks: while it renders, no stream gets its next token, and the gap a
client measures, and the one the server's own inter-token histogram records, grows by
the render. This script serves the simulated executor (``slopilot serve --executor
simulated``, its 10 ms decode step in real time) twice, each a process of this tree: one
as it is (``tree``), one rendering /metrics with prometheus_client's ``generate_latest``
over the same collectors (``generic``: what the server did before
``engine/metrics_text.py``). It streams ``--streams`` concurrent requests at one of them
from this process (a bare socket each, every text event stamped as it arrives) in four
arms, side by side, the order turning round by round so a busy machine slows all alike:

- ``none_tree``, ``none_generic``: the streams alone;
- ``scrape_tree``, ``scrape_generic``: the same while a process of its own GETs /metrics
  every ``--cadence-s`` (at fixed times from its start, not after the last answer), as
  Prometheus does every 15 s and the operator's and tuner's own readers do, here far
  more often so that the scrapes touch enough gaps to show in a P99 within a short run.

Per arm, the medians over ``--rounds`` of each round's token-gap P50, P99 and max as the
client measured them (one gap an event that brings tokens after the first, from the
event before it, however many it brings: ``ClientGaps``), and the server's own P99 of its
``vllm:inter_token_latency_seconds`` over the round (its histogram's increase, read as
``histogram_quantile`` reads it); per render, the scrape arm's excess over the other,
and the scrapes' median round trip as the scraper measured it under the load. Also, in
this process: one engine's render time both ways (every class's histograms populated,
and every series changed since the render before, as under load: the median of 50).

    .venv/bin/python benchmarks/scrape_stall.py [--streams 16] [--seconds 6] [--rounds 5]
        [--cadence-s 0.25] [--tokens 200]

Ends with ``RESULT render_ms_tree=... render_ms_generic=... scrape_ms_tree=...
scrape_ms_generic=... scrapes=... gaps=...``, then per arm ``gap_p50_ms_ARM=...
gap_p99_ms_ARM=... gap_max_ms_ARM=... server_itl_p99_ms_ARM=...`` and per render
``gap_p99_excess_ms_tree=... gap_max_excess_ms_tree=... server_itl_p99_excess_ms_tree=...``
(the scrape arm's median less the other's) and the same for ``generic``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import histogram_quantile
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loop_truth import percentile  # noqa: E402
from serving_latency import serve  # noqa: E402

ITL = "vllm:inter_token_latency_seconds"
RENDERS = ("tree", "generic")
ARMS = tuple(f"{kind}_{render}" for render in RENDERS for kind in ("none", "scrape"))
# ``slopilot serve`` with the render of before: prometheus_client's whole encoder.
GENERIC_SERVE = r"""
import sys
from prometheus_client import generate_latest
from slopilot.cli import main
from slopilot.engine.metrics import EngineMetrics
EngineMetrics.render = lambda self: generate_latest(self.registry)
sys.exit(main(sys.argv[1:]))
"""

# The scraper: its own process, so its HTTP client and parsing take nothing from the
# streams' client. It says "ready" once imported and starts on the next line of stdin.
SCRAPER = r"""
import json, sys, time
import httpx
url, cadence, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
trips = []
with httpx.Client(timeout=30) as client:
    start = time.perf_counter()
    k = 1
    while k * cadence < seconds:
        delay = start + k * cadence - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.perf_counter()
        client.get(url + "/metrics").raise_for_status()
        trips.append(time.perf_counter() - sent)
        k += 1
print(json.dumps(trips), flush=True)
"""


async def _stream(host: str, port: int, body: bytes, gaps: list[float]) -> None:
    """One streamed completion over a bare socket: each text event's gap after the one
    before it, one an event, however many tokens it brings (``ClientGaps``)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                 + body)
    last: float | None = None
    while line := await reader.readline():
        if not line.startswith(b"data: {"):
            continue
        stamp = time.perf_counter()
        # The placeholder tokenizer's tokens are words.
        tokens = sum(len(str(c.get("text") or "").split())
                     for c in json.loads(line[6:]).get("choices") or ())
        if not tokens:
            continue
        if last is not None:  # the first event's wait is its TTFT, not a gap
            gaps.append(stamp - last)
        last = stamp
    writer.close()


async def _load(url: str, streams: int, seconds: float, tokens: int) -> list[float]:
    """``streams`` clients, each sending its next request when its last one ended, until
    ``seconds`` are up: every token gap they measured."""
    host, port = url.removeprefix("http://").split(":")
    end = time.perf_counter() + seconds
    gaps: list[float] = []

    async def client(i: int) -> None:
        k = 0
        while time.perf_counter() < end:
            body = json.dumps({"prompt": f"client {i} request {k}", "max_tokens": tokens,
                               "stream": True, "ignore_eos": True}).encode()
            await _stream(host, int(port), body, gaps)
            k += 1

    await asyncio.gather(*(client(i) for i in range(streams)))
    return gaps


def _itl_buckets(url: str, histogram: str = ITL) -> dict[float, float]:
    """The server's inter-token histogram (``histogram``), every class summed: cumulative
    le -> count."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name != histogram:
            continue
        for s in family.samples:
            if s.name == histogram + "_bucket":
                le = s.labels["le"]
                edge = math.inf if le == "+Inf" else float(le)
                out[edge] = out.get(edge, 0.0) + s.value
    return out


@dataclass
class Round:
    """One round of one arm: the client's gap figures, the server's P99, the scrapes."""

    p50: float
    p99: float
    max: float
    server_p99: float
    gaps: int
    trips: list[float]


def run_arm(url: str, scraped: bool, args: argparse.Namespace,
            histogram: str = ITL) -> Round:
    """One round of one arm, the scraper started with the streams when ``scraped``;
    ``histogram``: the inter-token histogram the scraped server records, read before and
    after."""
    scraper = None
    if scraped:
        scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(args.cadence_s),
                                    str(args.seconds)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert scraper.stdin is not None and scraper.stdout is not None
        if scraper.stdout.readline().strip() != "ready":
            raise RuntimeError("the scraper did not start")
    before = _itl_buckets(url, histogram)
    if scraper is not None:
        assert scraper.stdin is not None
        scraper.stdin.write("go\n")
        scraper.stdin.flush()
    gaps = asyncio.run(_load(url, args.streams, args.seconds, args.tokens))
    trips: list[float] = []
    if scraper is not None:
        out, _ = scraper.communicate(timeout=60)
        trips = json.loads(out)
    after = _itl_buckets(url, histogram)
    served = {e: after[e] - before.get(e, 0.0) for e in after}
    return Round(percentile(gaps, 0.50), percentile(gaps, 0.99), max(gaps),
                 histogram_quantile(0.99, served), len(gaps), trips)


def render_ms(render: str) -> float:
    """One engine's render, every class's histograms populated as a server's are and
    every series changed since the render before (nothing kept from it)."""
    m = EngineMetrics("m")
    recorders = (m.observe_ttft, m.observe_token_gap)
    for p in Priority:
        for i in range(200):
            for observe in recorders:
                observe(p, 0.0001 * (i + 1))
            m.observe_delivered(p, 0.01 * (i + 1), i, "length")
    fn = m.render if render == "tree" else lambda: generate_latest(m.registry)
    times = []
    for i in range(50):
        for p in Priority:
            for observe in recorders:
                observe(p, 0.001 * i)
            m.observe_delivered(p, 0.01 * i, i, "length")
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def arguments(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of one arm's round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every arm")
    ap.add_argument("--cadence-s", type=float, default=0.25, help="seconds between scrapes")
    ap.add_argument("--tokens", type=int, default=200, help="max_tokens of each request")
    return ap.parse_args()


def side_by_side(urls: dict[str, str], args: argparse.Namespace,
                 histogram: str = ITL) -> dict[str, list[Round]]:
    """Every arm's rounds against the server of its render (``urls``: by render), the
    arms' order turning round by round."""
    results: dict[str, list[Round]] = {arm: [] for arm in ARMS}
    for url in urls.values():
        asyncio.run(_load(url, args.streams, 2.0, args.tokens))  # warm up
    for r in range(args.rounds):
        for arm in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
            kind, render = arm.split("_")
            res = run_arm(urls[render], kind == "scrape", args, histogram)
            results[arm].append(res)
            print(f"round {r} {arm:14}: {res.gaps} gaps, P50 {res.p50 * 1e3:.2f} ms, "
                  f"P99 {res.p99 * 1e3:.2f} ms, max {res.max * 1e3:.1f} ms; server ITL "
                  f"P99 {res.server_p99 * 1e3:.2f} ms", flush=True)
    return results


def result_line(results: dict[str, list[Round]], renders_ms: dict[str, float],
                server_key: str = "server_itl") -> str:
    """The ``RESULT`` line: ``server_key``, what the scraped server's own P99 is called."""

    def median(arm: str, key: str) -> float:
        return statistics.median(getattr(res, key) for res in results[arm]) * 1e3

    fields: dict[str, float] = {f"render_ms_{r}": renders_ms[r] for r in RENDERS}
    for render in RENDERS:
        trips = [t for res in results[f"scrape_{render}"] for t in res.trips]
        fields[f"scrape_ms_{render}"] = statistics.median(trips) * 1e3
    fields["scrapes"] = float(sum(len(res.trips) for arm in ARMS for res in results[arm]))
    fields["gaps"] = float(sum(res.gaps for arm in ARMS for res in results[arm]))
    keys = (("p50", "gap_p50_ms"), ("p99", "gap_p99_ms"), ("max", "gap_max_ms"),
            ("server_p99", f"{server_key}_p99_ms"))
    for key, name in keys:
        for arm in ARMS:
            fields[f"{name}_{arm}"] = median(arm, key)
    for _, name in keys[1:]:
        for render in RENDERS:
            fields[f"{name.replace('_ms', '_excess_ms')}_{render}"] = (
                fields[f"{name}_scrape_{render}"] - fields[f"{name}_none_{render}"])
    return "RESULT " + " ".join(f"{k}={v:.0f}" if k in ("scrapes", "gaps") else f"{k}={v:.3g}"
                                for k, v in fields.items())


def main() -> int:
    args = arguments(__doc__.split("\n\n")[0])
    with serve("--executor", "simulated") as tree, \
            serve("--executor", "simulated", launcher=("-c", GENERIC_SERVE)) as generic:
        results = side_by_side({"tree": tree, "generic": generic}, args)
    print(result_line(results, {r: render_ms(r) for r in RENDERS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
