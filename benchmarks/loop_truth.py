"""The loop's windows against its clients: does every figure the loop acts on match what
the clients measured on their own side?

Starts the demo's deployment (``LocalDeployment``: simulated-GPU replicas of the ``demo``
scenario, its knobs and SLO), the real Prometheus with the deployment's rules when the
binary is on PATH (``LocalPrometheus``) and the direct scrape (``DirectScrape``), and
drives the replicas with an open-loop Poisson load of its own whose client streams every
request and records its send time, the arrival of every chunk with output, the tokens in
it and its class. Over ``--windows`` consecutive windows of ``--window`` seconds (the
second starts with the demo's load shift, the third with a live config change PUT to
every replica as the controller commits one, the fourth with an SLO change, PUT
/admin/slo, the fifth with a live waiting-queue limit small enough that the replicas turn
clients away, 429) it compares, per window and class, what the loop's window evaluators report
(``PrometheusWindows`` as the demo builds it, and ``DirectScrape``) against the client's
own figures, counted as the engine counts them:

- TTFT P99: over the requests whose first chunk arrived in the window (send to first
  chunk);
- TBT P99: over the gaps that arrived in the window (one a chunk after the first, its
  wait since the one before, however many tokens it brought: ``ClientGaps``);
- finished requests, throughput (their output tokens / s), goodput (the output tokens /
  s of those that met their class's SLO by ``ClassSLO.met`` on the client's timings,
  the SLO the server had when they were sent) over the requests whose last chunk
  arrived in the window;
- attainment: the share of those tokens that were good (the client counting each
  request turned away at the tokens it asked for, which ``ignore_eos`` would have given;
  the loop as the operator's ``status.sloAttainment``, at the window's mean output
  length), and of those requests (the engines' verdict counters,
  ``slopilot_slo_requests_total``, read from Prometheus; the loop's summary has no
  per-request share);
- refused: the requests turned away for load (429) that were sent in the window; each
  also enters the client's TTFT P99 as a first token never given (infinite: its bucketed
  form reads the last finite edge, as the loop's does).

P99s read from histograms are bucketed (``histogram_quantile`` interpolates inside a
bucket) and a client's P99 over a dozen requests is nearly their maximum: the P99 rows
are for a reader to judge, the counts, rates and shares are the ones that should agree.

    .venv/bin/python benchmarks/loop_truth.py [--window 30] [--windows 5] [--rate 4]

Ends with ``RESULT key=value ...``: per source and figure, the median over windows and
classes of the relative error against the client (loop - client) / client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from slopilot.engine.histogram_quantiles import latency_quantile
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.slo import ClassSLO, SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.operator.slo_status import token_attainment
from slopilot.tuner.local.demo import RULES, phases
from slopilot.tuner.local.deployment import LocalDeployment
from slopilot.tuner.local.loadgen import Phase
from slopilot.tuner.local.prometheus_server import LocalPrometheus, find_prometheus
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.loop.ports import WindowEvaluator
from slopilot.tuner.prometheus.adapters import PrometheusWindows
from slopilot.tuner.prometheus.query import query_at
from slopilot.tuner.prometheus.rules import DEPLOYMENT_LABEL, render_rules_yaml, render_selector
from slopilot.tuner.study.evaluator import WindowRejected

NAME = "truth"
CLASSES = tuple(p.label for p in Priority)
FIGURES = ("ttft_p99_ms", "ttft_p99_bucketed", "tbt_p99_ms", "tbt_p99_bucketed", "finished",
           "throughput", "goodput", "attain_tokens", "attain_requests", "refused")
# The third window's live config (a smaller budget and chunk: what the demo's twin
# proposes for the long prompts after the shift) and the fourth's SLO (tighter TBT).
NEW_CONFIG = {"token_budget": 512, "chunk_size": 512}
# The fifth window's waiting-queue limit: small enough that the replicas turn clients away.
REFUSING = {"max_waiting": 1, "max_num_seqs": 2}
NEW_SLO = {"profile": "standard",
           "classes": {"p0": {"ttftP99Ms": 800, "tbtP99Ms": 40},
                       "p1": {"ttftP99Ms": 1500, "tbtP99Ms": 80}}}


# --------------------------------------------------------------------------- the client
@dataclass
class Record:
    """One streamed request as its client saw it, on the client's clock (wall seconds)."""

    cls: str
    slo: ClassSLO
    """The objectives its server judges it by: the SLO in force when it was sent."""
    sent: float
    arrivals: list[float] = field(default_factory=list)
    """When each chunk with output arrived."""
    tokens: list[int] = field(default_factory=list)
    """How many tokens each of those chunks brought."""
    done: bool = False
    """The stream ended with a finish reason: the request ran to its end."""
    refused: bool = False
    """Turned away for load (429): never served."""
    asked: int = 0
    """The tokens it asked for (``max_tokens``, all of which ``ignore_eos`` gives)."""

    @property
    def output_tokens(self) -> int:
        return sum(self.tokens)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of exact samples, linear between closest ranks (numpy's
    default); NaN when there are none."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    if math.isinf(xs[hi]) and (pos > lo or math.isinf(xs[lo])):
        return math.inf  # among the first tokens never given (inf - inf would read NaN)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def token_gaps(rec: Record) -> list[tuple[float, float]]:
    """``(arrived, gap)`` for every chunk that brought tokens after the first: its wait
    since the last one that did, however many it brought, as ``vllm bench serve`` times
    them (``ClientGaps``)."""
    out: list[tuple[float, float]] = []
    last: float | None = None
    for t, n in zip(rec.arrivals, rec.tokens, strict=True):
        if n > 0:
            if last is not None:
                out.append((t, t - last))
            last = t
    return out


def met(rec: Record) -> bool:
    """``ClassSLO.met`` on the client's own timings (a request with output)."""
    tbt = rec.slo.tbt_p99_ms
    gaps = token_gaps(rec)
    over = 0 if tbt is None else sum(1 for _, g in gaps if g > tbt / 1000.0)
    return rec.slo.met(rec.arrivals[0] - rec.sent, len(gaps), over)


@dataclass(frozen=True)
class Figures:
    """One class over one window: the rows of the comparison (NaN: nothing to read)."""

    ttft_p99_ms: float
    ttft_p99_bucketed: float
    """The client's: its samples read through the engine's buckets, as Prometheus reads
    a histogram (``histogram_quantiles.latency_quantile``); the loop's: its P99 again."""
    tbt_p99_ms: float
    tbt_p99_bucketed: float
    finished: float
    throughput: float
    goodput: float
    attain_tokens: float
    attain_requests: float
    refused: float

    def get(self, name: str) -> float:
        value: float = getattr(self, name)
        return value


def client_figures(records: Iterable[Record], start: float, end: float, cls: str
                   ) -> Figures:
    """What the clients of class ``cls`` measured in ``[start, end)``, each event in the
    window the engine's exposition counts it in: a TTFT when the first chunk arrived, a
    gap when its chunk did, a finished request (its tokens, its verdict) when its last
    chunk did."""
    def inside(t: float) -> bool:
        return start <= t < end

    refused = [r for r in records if r.cls == cls and r.refused and inside(r.sent)]
    mine = [r for r in records if r.cls == cls and r.arrivals]
    ttfts = [r.arrivals[0] - r.sent for r in mine if inside(r.arrivals[0])]
    never = [math.inf] * len(refused)  # a first token never given
    gaps = [g for r in mine for t, g in token_gaps(r) if inside(t)]
    finished = [r for r in mine if r.done and inside(r.arrivals[-1])]
    good = [r for r in finished if met(r)]
    span = end - start
    tokens = sum(r.output_tokens for r in finished)
    offered = tokens + sum(r.asked for r in refused)
    good_tokens = sum(r.output_tokens for r in good)
    judged = len(finished) + len(refused)
    return Figures(
        ttft_p99_ms=percentile(ttfts + never, 0.99) * 1000,
        ttft_p99_bucketed=latency_quantile(0.99, ttfts, never=len(refused)) * 1000,
        tbt_p99_ms=percentile(gaps, 0.99) * 1000,
        tbt_p99_bucketed=latency_quantile(0.99, gaps) * 1000,
        finished=float(len(finished)), throughput=tokens / span, goodput=good_tokens / span,
        attain_tokens=good_tokens / offered if offered else math.nan,
        attain_requests=len(good) / judged if judged else math.nan,
        refused=float(len(refused)))


def loop_figures(summary: WindowSummary, cls: str,
                 attain_requests: float = math.nan) -> Figures:
    """What a window evaluator reported for class ``cls``."""
    c = summary.classes[Priority.parse(cls)]

    def number(v: float | None) -> float:
        return math.nan if v is None else v

    ttft, tbt = number(c.ttft_p99_ms), number(c.tbt_p99_ms)
    return Figures(
        ttft_p99_ms=ttft, ttft_p99_bucketed=ttft, tbt_p99_ms=tbt, tbt_p99_bucketed=tbt,
        finished=c.requests_finished, throughput=c.throughput_tok_s,
        goodput=c.goodput_tok_s, attain_tokens=number(token_attainment(c)),
        attain_requests=attain_requests, refused=c.requests_refused)


def relative_error(loop: float, client: float) -> float:
    """(loop - client) / client; 0 when both are 0, NaN when either is missing."""
    if math.isnan(loop) or math.isnan(client):
        return math.nan
    if client == 0:
        return 0.0 if loop == 0 else math.inf
    return (loop - client) / client


def _lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    mu = math.log(mean) - sigma * sigma / 2
    return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))


class StreamingLoad:
    """Open-loop Poisson load on one asyncio thread; every request streamed and recorded."""

    def __init__(self, endpoints: Callable[[], list[str]], phase: Phase,
                 slo: Callable[[], SLOSpec], *, model: str, seed: int = 0) -> None:
        self.endpoints, self.phase, self.slo, self.model = endpoints, phase, slo, model
        self.rng = random.Random(seed)
        self.records: list[Record] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()),
                                        name="truth-load", daemon=True)
        # The client's clock: wall time, from the monotonic counter (no NTP steps).
        self._wall0, self._perf0 = time.time(), time.perf_counter()

    def now(self) -> float:
        return self._wall0 + (time.perf_counter() - self._perf0)

    def start(self) -> StreamingLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(70)

    async def _run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            sent = 0
            next_at = self.now()
            while not self._stop.is_set():
                p = self.phase
                next_at += self.rng.expovariate(p.rate)
                await asyncio.sleep(max(0.0, next_at - self.now()))
                urls = self.endpoints()
                cls = self.rng.choices(list(p.classes), weights=list(p.classes.values()))[0]
                # Drawn in this order (the prompt first), as every earlier run drew them.
                words = _lognormal(self.rng, p.prompt_mean, p.sigma, 16, p.prompt_max) - 1
                asked = _lognormal(self.rng, p.output_mean, 0.5, 4, 256)
                body = {"model": self.model, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True},
                        "prompt": f"t{sent} " + "w " * words, "max_tokens": asked,
                        "priority": cls}
                rec = Record(cls, self.slo().class_slo(cls), self.now(), asked=asked)
                task = asyncio.create_task(self._post(client, urls[sent % len(urls)], body, rec))
                sent += 1
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict[str, object],
                    rec: Record) -> None:
        rec.sent = self.now()
        try:
            async with client.stream("POST", url + "/v1/completions", json=body) as resp:
                if resp.status_code == 429:  # turned away for load: the client got nothing
                    rec.refused = True
                    self.records.append(rec)
                    return
                if resp.status_code != 200:
                    self.failed += 1
                    return
                async for line in resp.aiter_lines():
                    t = self.now()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or ():
                        n = len((choice.get("text") or "").split())
                        if n:
                            rec.arrivals.append(t)
                            rec.tokens.append(n)
                        if choice.get("finish_reason"):
                            rec.done = True
        except httpx.HTTPError:
            self.failed += 1
            return
        self.records.append(rec)


# --------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Window:
    index: int
    start: float
    end: float
    event: str
    slo: SLOSpec


def _verdict_attainment(prom_url: str, slo: SLOSpec, start: float, end: float
                        ) -> dict[str, float]:
    """The share of each class's requests the engines judged met under ``slo``."""
    query = query_at(prom_url)
    out: dict[str, float] = {}
    for p in Priority:
        label = slo.class_slo(p).label
        sel = {DEPLOYMENT_LABEL: NAME, "priority_class": p.label, "slo": label}
        w = f"[{int(end - start)}s]"
        expr = (f"sum(increase(slopilot_slo_requests_total"
                f"{render_selector({**sel, 'met': 'true'})}{w})) / "
                f"sum(increase(slopilot_slo_requests_total{render_selector(sel)}{w}))")
        result = query(expr, end)
        out[p.label] = float(result[0]["value"][1]) if result else math.nan
    return out


def _put_slo(dep: LocalDeployment, slo: SLOSpec) -> None:
    with httpx.Client(timeout=10.0, headers={"Authorization": f"Bearer {dep.token}"}) as c:
        for url in dep.endpoints():
            c.put(url + "/admin/slo", json=slo.to_dict()).raise_for_status()


def run(args: argparse.Namespace, work: Path
        ) -> tuple[list[tuple[Window, str, dict[str, Figures]]], list[Record]]:
    scenario = load_scenario("demo")
    before, after = phases(False, args.replicas)
    if args.rate is not None:
        before = Phase(args.rate, before.prompt_mean, before.output_mean, before.classes,
                       before.sigma, before.prompt_max)
        after = Phase(args.rate, after.prompt_mean, after.output_mean, after.classes,
                      after.sigma, after.prompt_max)
    new_slo = SLOSpec.from_dict(NEW_SLO)
    current = {"slo": scenario.slo}
    use_prom = find_prometheus() is not None if args.prometheus == "auto" \
        else args.prometheus == "on"
    with contextlib.ExitStack() as stack:
        dep = stack.enter_context(LocalDeployment(
            NAME, work, replicas=args.replicas, max_replicas=args.replicas,
            scenario="demo", knobs=scenario.engine, slo=scenario.slo))
        scrape = DirectScrape(dep.endpoints, scenario.slo, RULES, min_requests=8).start()
        stack.callback(scrape.stop)
        prom: LocalPrometheus | None = None
        if use_prom:
            rules = work / "rules.yaml"
            rules.write_text(render_rules_yaml(scenario.slo, NAME, options=RULES))
            prom = LocalPrometheus(work / "prometheus", dep.targets_file, [rules])
            stack.callback(prom.stop)
            prom.start()
        load = StreamingLoad(dep.endpoints, before, lambda: current["slo"], model=NAME,
                             seed=args.seed).start()
        stack.callback(load.stop)
        print(f"{args.replicas} replicas {', '.join(dep.endpoints())}; prometheus "
              f"{prom.url if prom else 'off'}; load {before.rate:g} req/s", flush=True)
        t0 = load.now() + args.warmup
        windows: list[Window] = []

        def event(i: int) -> str:
            """What changes as window ``i`` starts, done now."""
            if i == 1:
                load.phase = after
                return "load shift"
            if i == 2:
                dep.apply_config(NEW_CONFIG, canary=False)  # as the controller commits
                return f"config {NEW_CONFIG}"
            if i == 3:
                current["slo"] = new_slo
                _put_slo(dep, new_slo)
                return "SLO change"
            if i == 4:
                dep.apply_config(REFUSING, canary=False)
                return f"queue limit {REFUSING}"
            return "steady"

        for i in range(args.windows):
            start = t0 + i * args.window
            time.sleep(max(0.0, start - load.now()))
            name = event(i)
            windows.append(Window(i, start, start + args.window, name, current["slo"]))
            print(f"window {i} at t+{start - t0:.0f}s: {name}", flush=True)
        time.sleep(max(0.0, windows[-1].end - load.now()) + 3.0)  # a scrape past the end
        load.stop()
        out = []
        for w in windows:
            client = {c: client_figures(load.records, w.start, w.end, c) for c in CLASSES}
            out.append((w, "client", client))
            sources: list[tuple[str, WindowEvaluator, Mapping[str, float]]] = []
            if prom is not None:
                # As the demo builds it, with the SLO the replicas judge by in the window.
                sources.append(("prom", PrometheusWindows(
                    prom.url, {DEPLOYMENT_LABEL: NAME}, w.slo, min_requests=8),
                    _verdict_attainment(prom.url, w.slo, w.start, w.end)))
            # The scrape judges by the SLO it holds, as a rebuilt evaluator would.
            scrape.slo = w.slo
            sources.append(("scrape", scrape, {}))
            for name, evaluator, verdicts in sources:
                try:
                    summary = evaluator.measure(w.start, w.end, canary=False)
                except WindowRejected as exc:
                    print(f"window {w.index} {name}: rejected: {exc}")
                    continue
                out.append((w, name, {c: loop_figures(summary, c, verdicts.get(c, math.nan))
                                      for c in CLASSES}))
        print(f"{len(load.records)} requests recorded, {load.failed} failed; "
              f"{sum(not r.done for r in load.records)} unfinished", flush=True)
    return out, load.records


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.4g}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x * 100:+.1f}%")


def report(rows: list[tuple[Window, str, dict[str, Figures]]]) -> dict[str, float]:
    """Prints the per-window table; returns the medians of the relative errors."""
    by: dict[tuple[int, str], dict[str, Figures]] = {(w.index, s): f for w, s, f in rows}
    windows = sorted({w.index: w for w, _, _ in rows}.values(), key=lambda w: w.index)
    sources = [s for s in ("prom", "scrape") if any(k[1] == s for k in by)]
    head = f"{'win':>3s} {'class':5s} {'figure':16s} {'client':>9s}"
    for s in sources:
        head += f" {s:>9s} {'err':>8s}"
    print(head)
    errors: dict[tuple[str, str], list[float]] = {}
    for w in windows:
        client = by[(w.index, "client")]
        for c in CLASSES:
            for fig in FIGURES:
                line = f"{w.index:3d} {c:5s} {fig:16s} {_fmt(client[c].get(fig)):>9s}"
                for s in sources:
                    got = by.get((w.index, s))
                    value = got[c].get(fig) if got else math.nan
                    err = relative_error(value, client[c].get(fig))
                    line += f" {_fmt(value):>9s} {_pct(err):>8s}"
                    if math.isfinite(err):
                        errors.setdefault((s, fig), []).append(err)
                print(line)
    return {f"{s}_{fig}_err": statistics.median(v) for (s, fig), v in errors.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=float, default=30.0, help="seconds per window")
    ap.add_argument("--windows", type=int, default=5, help="consecutive windows (events in "
                    "the 2nd: load shift, 3rd: config, 4th: SLO, 5th: a queue limit that "
                    "turns clients away)")
    ap.add_argument("--warmup", type=float, default=6.0, help="seconds of load before the first")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rate", type=float, default=None,
                    help="requests/s in all (default: the demo's, 2 per replica)")
    ap.add_argument("--prometheus", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--records", type=Path, default=None,
                    help="write the client's records and the windows here (JSON)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loop-truth-") as tmp:
        rows, records = run(args, Path(tmp))
    if args.records is not None:
        args.records.write_text(json.dumps({
            "windows": [[w.start, w.end, w.event] for w, s, _ in rows if s == "client"],
            "records": [{"cls": r.cls, "slo": r.slo.label, "sent": r.sent,
                         "arrivals": r.arrivals, "tokens": r.tokens, "done": r.done,
                         "refused": r.refused, "asked": r.asked}
                        for r in records]}))
    for w, _, _ in rows:
        if _ == "client":
            print(f"window {w.index}: {w.event}")
    medians = report(rows)
    print("RESULT " + " ".join(f"{k}={v:+.3f}" for k, v in sorted(medians.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
