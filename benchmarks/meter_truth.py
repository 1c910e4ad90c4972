"""The meter's verdicts against a client's own, beside the histogram product vLLM gives.

``slopilot serve`` on the simulated executor (A100 + Llama-3-8B in real time) stands in
for vLLM: it is started with no SLO, so that, like vLLM, it exports latency histograms
and no per-request verdicts. Its token budget and chunk are 4,096, so a long prompt's
prefill stalls the decodes batched with it and the slow gaps bunch on a few requests,
which is where the product of histogram shares reads goodput high. ``slopilot meter``
runs in front of it, judging by ``--slo``'s P0 objectives. An open-loop client (Poisson)
streams a mix of short and long prompts through the meter, every request P0, and judges
each request itself: ``ClassSLO.met`` on its own chunk arrivals, one gap a chunk after
the first, however many tokens it brings. Over the same requests, the share of output
tokens that met the SLO:

- ``client``: the client's own verdicts, the truth;
- ``meter``: the meter's verdict counters, which the goodput rule reads per replica;
- ``product``: the engine's own histograms, the share of first tokens within the TTFT
  target times the share of gaps within the TBT target (``histogram_share_within``), as
  the rules read a replica without verdicts (a vLLM pod without the meter).

And the TTFT and TBT P99 over the same requests:

- ``client``: the client's own, exact (its first chunk's arrival from its send; its
  gaps as above);
- ``meter``: the meter's client-side histograms (``slopilot_client_*``), read as the
  rules read them on a vLLM deployment (``histogram_quantile`` on its buckets), beside
  ``client_bucketed``, the client's own on the same edges (the buckets' share of the
  error);
- ``made``: as vLLM measures them, from when the engine made each token (the stand-in
  runs with one more observer, ``made_time_engine.py``), on vLLM's own bucket edges,
  what the rules read before the meter had histograms (and still read where it saw no
  stream); ``made_exact`` without the buckets.

Then what the meter costs: at a light load, requests alternate between the engine and
the meter, and the client's TTFT and mean gap through each are compared (medians of
pairs).

    .venv/bin/python benchmarks/meter_truth.py [--rate 6] [--seconds 40] [--seed 1]

Ends with ``RESULT key=value ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import (
    histogram_quantile,
    histogram_share_within,
    latency_quantile,
)
from slopilot.engine.meter.client_latency import CLIENT_TBT, CLIENT_TTFT
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.engine.verdicts import SLO_TOKENS
from slopilot.tuner.prometheus.latency_sources import TBT, TTFT, VLLM_LATENCY_BUCKETS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loop_truth import percentile, relative_error  # noqa: E402
from serving_latency import serve  # noqa: E402

SLO = {"classes": {"p0": {"ttftP99Ms": 1000, "tbtP99Ms": 50}}}


@dataclass
class Record:
    sent: float
    arrivals: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    done: bool = False

    def gaps(self) -> list[float]:
        """One gap a chunk that brings tokens after the first, its wait since the last
        one that did, however many it brings (``ClientGaps``, as the meter and the
        engine's server count them, and ``vllm bench serve`` times them)."""
        at = [t for t, n in zip(self.arrivals, self.tokens, strict=True) if n > 0]
        return [b - a for a, b in itertools.pairwise(at)]

    def met(self, slo: ClassSLO) -> bool:
        tbt = slo.tbt_p99_ms
        gaps = self.gaps()
        over = 0 if tbt is None else sum(1 for g in gaps if g > tbt / 1000.0)
        return slo.met(self.arrivals[0] - self.sent, len(gaps), over)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MeterProcess:
    url: str
    pid: int

    def cpu_s(self) -> float:
        """CPU seconds the meter's process has used (user and system)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def meter(upstream: str, slo_file: Path,
          launcher: Sequence[str] = ("-m", "slopilot.cli"),
          flags: Sequence[str] = ()) -> Iterator[MeterProcess]:
    """A ``slopilot meter`` process of this tree in front of ``upstream``; ``launcher``:
    what Python runs, given ``meter`` and its flags (``meter_scrape_stall.py``: with the
    render of before); ``flags``: more of the meter's (``client_truth.py``: its
    ``--priority-class``)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, *launcher, "meter", "--upstream",
                             upstream, "--host", "127.0.0.1", "--port", str(port),
                             "--slo-file", str(slo_file), "--log-level", "warning", *flags],
                            env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/metrics", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the meter did not start")
            time.sleep(0.2)
        yield MeterProcess(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


async def _stream(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                  rec: Record) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "priority": "p0"}
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            return
        async for line in resp.aiter_lines():
            t = time.perf_counter()
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or ():
                if n := len((choice.get("text") or "").split()):
                    rec.arrivals.append(t)
                    rec.tokens.append(n)
                if choice.get("finish_reason"):
                    rec.done = True


async def load(url: str, rate: float, seconds: float, seed: int) -> list[Record]:
    """Poisson arrivals: 70 % short prompts (30 words), 30 % long (2,000), 64 tokens out,
    each prompt's words its own."""
    rng = random.Random(seed)
    records: list[Record] = []
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None)) as c:
        tasks = []
        t0 = time.perf_counter()
        due = 0.0
        while due < seconds:
            delay = t0 + due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            words = 2000 if rng.random() < 0.3 else 30
            rec = Record(time.perf_counter())
            records.append(rec)
            # Words of its own: a prompt the prefix cache already holds is prefilled free.
            prompt = " ".join(f"w{rng.randrange(10**6)}" for _ in range(words))
            tasks.append(asyncio.create_task(_stream(c, url, prompt, 64, rec)))
            due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return [r for r in records if r.done and r.arrivals]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _diff(after: Samples, before: Samples) -> Samples:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _buckets(d: Samples, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for (n, labels), v in d.items():
        lab = dict(labels)
        if n == name + "_bucket" and lab.get("priority_class") == "p0":
            le = math.inf if lab["le"] == "+Inf" else float(lab["le"])
            out[le] = out.get(le, 0.0) + v
    return out


def _made(url: str) -> dict[str, list[float]]:
    """The stand-in engine's made-time TTFTs and gaps so far (``made_time_engine.py``)."""
    made: dict[str, list[float]] = httpx.get(url, timeout=30).json()
    return made


def _bucketed(samples: list[float], edges: Sequence[float]) -> dict[float, float]:
    """``samples`` as a histogram on ``edges`` (cumulative, with +Inf) would count them."""
    xs = sorted(samples)
    return {**{e: float(bisect.bisect_right(xs, e)) for e in edges}, math.inf: float(len(xs))}


def p99s(records: list[Record], m: Samples, made: dict[str, list[float]]) -> dict[str, float]:
    """TTFT and TBT P99 (ms) as the client measured them, as the meter's histograms give
    them, and as the engine made them (vLLM's way), each with its error against the
    client's."""
    out: dict[str, float] = {}
    for short, client, meter_metric, made_key, vllm_metric in (
            ("ttft", [r.arrivals[0] - r.sent for r in records], CLIENT_TTFT, "ttft", TTFT),
            ("tbt", [g for r in records for g in r.gaps()], CLIENT_TBT, "gaps", TBT)):
        truth_ms = percentile(client, 0.99) * 1e3
        figures = {
            # The client's own on the meter's edges: what of the meter's error is theirs.
            "client_bucketed": latency_quantile(0.99, client) * 1e3,
            "meter": histogram_quantile(0.99, _buckets(m, meter_metric)) * 1e3,
            "made": histogram_quantile(0.99, _bucketed(
                made[made_key], VLLM_LATENCY_BUCKETS[vllm_metric])) * 1e3,
            "made_exact": percentile(made[made_key], 0.99) * 1e3}
        out[f"client_{short}_p99_ms"] = truth_ms
        print(f"{short.upper()} P99: client {truth_ms:.1f} ms; " + "; ".join(
            f"{name} {ms:.1f} ms ({relative_error(ms, truth_ms):+.1%})"
            for name, ms in figures.items()))
        for name, ms in figures.items():
            out[f"{name}_{short}_p99_ms"] = ms
            out[f"{name}_{short}_p99_err"] = relative_error(ms, truth_ms)
    return out


def truth(args: argparse.Namespace, engine: str, proc: MeterProcess,
          made_url: str) -> dict[str, float]:
    metered = proc.url
    slo = SLOSpec.from_dict(SLO).p0
    assert slo.ttft_p99_ms is not None and slo.tbt_p99_ms is not None
    asyncio.run(load(metered, args.rate, 3.0, args.seed + 1000))  # warm up
    before_e, before_m, made_before = _scrape(engine), _scrape(metered), _made(made_url)
    cpu_before = proc.cpu_s()
    records = asyncio.run(load(metered, args.rate, args.seconds, args.seed))
    cpu_s = proc.cpu_s() - cpu_before
    after_e, after_m, made_after = _scrape(engine), _scrape(metered), _made(made_url)
    made = {k: v[len(made_before[k]):] for k, v in made_after.items()}
    tokens = sum(sum(r.tokens) for r in records)
    client = sum(sum(r.tokens) for r in records if r.met(slo)) / tokens
    m = _diff(after_m, before_m)
    good = sum(v for (n, lab), v in m.items() if n == SLO_TOKENS and dict(lab)["met"] == "true"
               and dict(lab)["priority_class"] == "p0")
    judged = sum(v for (n, lab), v in m.items() if n == SLO_TOKENS
                 and dict(lab)["priority_class"] == "p0")
    e = _diff(after_e, before_e)
    product = (histogram_share_within(slo.ttft_p99_ms / 1000,
                                      _buckets(e, "vllm:time_to_first_token_seconds"))
               * histogram_share_within(slo.tbt_p99_ms / 1000,
                                        _buckets(e, "vllm:inter_token_latency_seconds")))
    meter_share = good / judged if judged else math.nan
    requests_met = sum(1 for r in records if r.met(slo))
    print(f"{len(records)} requests streamed through the meter, {tokens} tokens; "
          f"{requests_met} met the SLO on the client's side")
    print(f"{'':10} {'tokens that met the SLO':>24} {'error':>8}")
    for name, share in (("client", client), ("meter", meter_share), ("product", product)):
        err = "" if name == "client" else f"{(share - client) / client:+8.1%}"
        print(f"{name:10} {share:24.3f} {err:>8}")
    chunks = sum(len(r.arrivals) for r in records)
    print(f"the meter's CPU: {cpu_s:.2f} s for {chunks} chunks of {len(records)} streams in "
          f"{args.seconds:g} s ({cpu_s / chunks * 1e6:.0f} us a chunk, "
          f"{cpu_s / args.seconds:.3f} of a core)")
    return {"meter_cpu_us_per_chunk": cpu_s / chunks * 1e6,
            "meter_cores": cpu_s / args.seconds,
            "requests": len(records), "client_share": client, "meter_share": meter_share,
            "product_share": product, "meter_err": (meter_share - client) / client,
            "product_err": (product - client) / client,
            "meter_judged_tokens_ratio": judged / tokens} | p99s(records, m, made)


async def _paired(engine: str, metered: str, pairs: int) -> list[tuple[Record, Record]]:
    out = []
    async with httpx.AsyncClient(timeout=None) as c:
        for i in range(pairs):
            one = []
            for url in (engine, metered) if i % 2 == 0 else (metered, engine):
                rec = Record(time.perf_counter())
                await _stream(c, url, f"user {i} asks", 32, rec)
                one.append((url, rec))
            d = next(r for u, r in one if u == engine)
            m = next(r for u, r in one if u == metered)
            out.append((d, m))
            await asyncio.sleep(0.2)
    return out


def cost(engine: str, metered: str, pairs: int) -> dict[str, float]:
    pairs_ = [(d, m) for d, m in asyncio.run(_paired(engine, metered, pairs))
              if d.arrivals and m.arrivals]
    ttft = [(m.arrivals[0] - m.sent) - (d.arrivals[0] - d.sent) for d, m in pairs_]
    gap = [statistics.fmean(m.gaps()[1:]) - statistics.fmean(d.gaps()[1:]) for d, m in pairs_]
    direct_ttft = statistics.median(d.arrivals[0] - d.sent for d, _ in pairs_)
    print(f"cost, {len(pairs_)} pairs at a light load: TTFT "
          f"{statistics.median(ttft) * 1e3:+.2f} ms through the meter (median of pairs; "
          f"direct {direct_ttft * 1e3:.2f} ms), mean gap {statistics.median(gap) * 1e3:+.3f} ms")
    return {"meter_ttft_added_ms": statistics.median(ttft) * 1e3,
            "direct_ttft_ms": direct_ttft * 1e3,
            "meter_gap_added_ms": statistics.median(gap) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=6.0, help="requests per second")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=40, help="cost: requests each way")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        slo_file = Path(tmp) / "slo.json"
        slo_file.write_text(json.dumps(SLO))
        made_port = _free_port()
        stand_in = (str(ROOT / "benchmarks" / "made_time_engine.py"), "--made-port",
                    str(made_port))
        with serve("--executor", "simulated", "--set", "token_budget=4096",
                   "--set", "chunk_size=4096", launcher=stand_in) as engine, \
                meter(engine, slo_file) as metered:
            fields = truth(args, engine, metered, f"http://127.0.0.1:{made_port}/")
            fields |= cost(engine, metered.url, args.pairs)
    print("RESULT " + " ".join(f"{k}={v:.4g}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
