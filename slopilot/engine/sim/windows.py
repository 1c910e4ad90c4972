"""Representative windows of a workload: what an offline study judges each config on.

The first minutes of a trace are rarely its hardest: a config tuned on them can trade
away exactly the headroom the busy part needs. So a trace is judged on windows chosen
from the trace itself, once and deterministically (no randomness: the same trace and
options give the same windows):

- the busiest window by arrivals (requests per second),
- the busiest by tokens (prompt + output tokens per second: the prefill and decode work),
  not overlapping the first by more than half its length. A prompt's tokens that an
  earlier prompt sent as the same prefix (Mooncake's ``hash_ids``, a JSONL session's
  earlier turns) are left out (``prefix_reuse.fresh_tokens``): the prefix cache serves
  them, and a minute of follow-ups with long shared contexts is not the busiest because
  its prompts are long (judged so, a minute of fresh documents with fewer tokens, all
  prefilled, got no window, and a study said "holds" where the whole trace missed),
- the sharpest burst, where one is outside those two: the window where the trace's
  arrivals pile up the deepest queue of work (the same tokens) on an engine
  serving the busiest minute's token rate, when that queue is more than twice as deep
  as any the busiest windows build. A minute's averages hide a sub-minute burst: 15
  prompts of 6,000 tokens within a second at an off-peak hour are neither the busiest
  minute by arrivals nor by tokens, yet their queue is the trace's worst TTFT (and the
  minute a live alert fires on); judged without it, a study said "holds" where the
  whole trace missed;
- a typical one: the window of the trace's fixed grid whose arrival and token rates are
  closest to the medians over the grid's windows that carry the traffic (those holding
  a tenth or more of the requests of the window a typical request arrives in),
  overlapping neither
  (none when every such window overlaps them). Empty windows are left out: a bursty
  trace's median minute is silent, and a config judged on silence is judged on nothing;
- the heaviest prompts, where they lie outside those: the window whose prompt at its
  P99's rank is the longest (fresh tokens, as above, of the requests the deployment
  serves at all), when that is ``HEAVY_RATIO`` times longer than the chosen windows' own.
  A P99 over n requests reads between the two that numpy's linear quantile (the
  summary's) interpolates, the lower one the ``n - floor(0.99 (n - 1))``-th longest:
  the 2nd of up to 101, the 3rd of up to 201. So a quiet minute's P99 is set by its two
  or three heaviest requests, not by its load: a minute of ~66 requests holding six of
  the trace's longest prompts (too few tokens at once for a burst) read 652 ms on one
  replica where the busiest minutes read 78, and a study judged without it said
  "holds" where that minute of the whole replay missed its 500 ms. Each of that many
  requests needs at least that prompt's prefill, so the window's P99 TTFT is at least
  it, whatever else the minute holds;
- the fullest KV cache, where it lies outside those: the window where the requests in
  the cache, its own and those still in flight from up to a lifetime before it, ask for
  the most beyond what the cache admits. The windows above count what *arrives* in a
  minute, but a request that lives minutes fills the cache for minutes after it came:
  on a trace of requests living ~2.5 minutes (0.2 req/s on one slow replica) a minute
  of few arrivals (300-360 s) found the cache full of the requests from before, three
  of its requests waited 0.8-9.2 s (that minute's P99 8.7 s), and a study judged
  without it said "holds" where the whole replay missed. Each request is taken to hold
  its context from its arrival for as long as it lives served without queueing (its
  prefill, then its output at a full cache's decode step: ``lifetimes.residency_s``),
  growing from its prompt to its prompt plus output (``kv_demand``: no simulation). The
  window holding the most token-seconds of that demand over what the deployment admits
  (every replica's cache less its admission watermark: past it a new request waits for
  room) gets a window of its own when that is ``KV_EXCESS_RATIO`` times what any chosen
  window holds; of windows holding all of it, the middle one. Measured against what the
  cache admits, not only against the other windows: the demand changes slowly (each
  context stays a lifetime), so the fullest minute is a few percent above the busiest
  ones on most traces, and only where it passes the cache's room does anything wait.
  The room a study passes (``tuner/sim/robust.plan_windows``) is its start config's on
  the replicas it starts from (the fewest it judges; the router spreads the requests
  over them): a trial with less room queues there first, and the window is the trace's
  fullest either way.

Each window is simulated with ``warmup_s`` of the trace before it (so it does not start
on an idle engine, which no minute of live traffic does) and ``drain_s`` after it
(arrivals continue; the window's requests are followed and then censored); only
requests arriving inside the window are counted (``simulator.Measure``).

A generated workload has no busy part to find: it is judged on several seeds instead,
each over the whole duration from t=0 (its phases are placed on its own clock, so a
warm-up would shift them). Compared with SCOOT's repeated, shuffled stress tests, which
replay one request set several times in new orders, this keeps the trace's burst
structure (shuffling spreads a burst out) and aims the repeats at the hardest parts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slopilot.engine.sim.kv_demand import KVDemand
from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.trace import TraceRecord


@dataclass(frozen=True, slots=True)
class WindowChoice:
    """One window to judge on, on the replay's clock (seconds after its first request)."""

    name: str
    start_s: float
    end_s: float
    warmup_s: float
    """Simulated before ``start_s`` (at most ``start_s``: a trace has no time before it)."""
    drain_s: float
    seed: int | None = None
    """The workload seed (generated workloads); None for a trace window."""
    arrival_rate: float | None = None
    """Requests per second arriving in the window (trace windows)."""
    token_rate: float | None = None
    """Prompt + output tokens per second arriving in the window (trace windows), less the
    prompt tokens an earlier prompt sent as the same prefix where the trace says so."""
    shared_prefixes: bool = False
    """The trace's prompts share prefixes, left out of ``token_rate``."""
    p99_prompt_tokens: float | None = None
    """The heaviest prompts' window: the fresh prompt tokens of its request at the P99's
    rank (at least that many of its requests have at least as many)."""
    kv_share: float | None = None
    """The fullest KV cache's window: the most KV tokens its requests and those still in
    flight hold at once, estimated (``kv_demand``), as a share of what the cache admits."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.start_s < self.end_s) or self.warmup_s < 0 or self.drain_s < 0 \
                or self.warmup_s > self.start_s + 1e-9:
            raise ValueError(f"window {self.name!r}: need 0 <= start < end, "
                             "0 <= warmup <= start and drain >= 0")

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def describe(self) -> str:
        """``busiest arrivals: 660-720 s (20.1 req/s, 29,472 tok/s)`` or ``seed 1: 0-60 s``;
        ``tok/s past shared prefixes`` where the prompts share them; the heaviest
        prompts' window says ``prompts of 7,000+ tokens at its P99``, the fullest KV
        cache's ``KV cache asked for ~105% of what it admits``."""
        text = f"{self.name}: {self.start_s:,.0f}-{self.end_s:,.0f} s"
        if self.arrival_rate is not None and self.token_rate is not None:
            past = " past shared prefixes" if self.shared_prefixes else ""
            heavy = "" if self.p99_prompt_tokens is None else \
                f"; prompts of {self.p99_prompt_tokens:,.0f}+ tokens at its P99"
            full = "" if self.kv_share is None else \
                f"; KV cache asked for ~{self.kv_share:.0%} of what it admits"
            text += (f" ({self.arrival_rate:.1f} req/s, {self.token_rate:,.0f} "
                     f"tok/s{past}{heavy}{full})")
        return text


def _rates(times: np.ndarray, tokens: np.ndarray, starts: np.ndarray,
           length: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals and tokens in [s, s + length) for each start s."""
    lo = np.searchsorted(times, starts, side="left")
    hi = np.searchsorted(times, starts + length, side="left")
    cum = np.concatenate(([0.0], np.cumsum(tokens)))
    return (hi - lo).astype(np.float64), cum[hi] - cum[lo]


# A window carries the traffic when it holds at least this share of the requests of the
# window a typical request arrives in: a diurnal trace's night minutes do not, however
# many of them there are.
QUIET_FRACTION = 0.1


def _carrying(counts: np.ndarray) -> np.ndarray:
    """Which windows carry the traffic: those holding at least ``QUIET_FRACTION`` of the
    requests of the window a typical request arrives in (the median of the windows'
    counts, each weighted by its requests). A cut by the quiet windows' share of all
    requests had a cliff: 30 night minutes of 2 requests (4.8 % of a trace) were all
    kept, and the median minute was a night one."""
    busy = counts > 0
    if not busy.any():
        return busy
    held = counts[busy]
    order = np.argsort(held, kind="stable")
    weight = np.cumsum(held[order])
    typical = float(held[order][int(np.searchsorted(weight, weight[-1] / 2))])
    return busy & (counts >= QUIET_FRACTION * typical)


def _grid_with_arrivals(times: np.ndarray, span: float, length_s: float) -> np.ndarray:
    """The starts of the fixed grid's windows (``k * length_s`` up to the last whole one)
    that may hold an arrival, in order: every window of the span would be as many as the
    span holds windows, and two requests 1e10 s apart asked for gigabytes. The typical
    window is chosen among those with arrivals only, so the rest need not exist."""
    n = math.ceil((span - length_s + 1e-9) / length_s)  # np.arange's length
    k = np.floor(times / length_s)
    # The neighbours too, against rounding in t / length: an empty one is left out later.
    k = np.unique(np.concatenate((k - 1, k, k + 1)))
    return k[(k >= 0) & (k < n)] * length_s


def _clear_of(starts: np.ndarray, chosen: Sequence[WindowChoice],
              length_s: float) -> np.ndarray:
    """Which ``starts`` overlap none of the ``chosen`` windows by more than half."""
    taken = np.array([w.start_s for w in chosen])
    return (np.abs(starts[:, None] - taken[None, :]) >= length_s / 2).all(axis=1)


BURST_DEPTH = 2.0
"""How many times deeper than the busiest windows' own queue a burst's must be for a
window of its own (a window costs a simulation per config; a queue about as deep as
theirs is judged there already)."""


def _sharpest_burst(times: np.ndarray, tokens: np.ndarray, rate: float,
                    chosen: Sequence[WindowChoice], span: float,
                    length_s: float) -> float | None:
    """The start of the window holding the deepest queue of ``tokens`` that the
    arrivals build on a server of ``rate`` tokens per second (a fluid queue: Lindley's
    recursion, in closed form), when that queue lies outside the ``chosen`` windows and
    is ``BURST_DEPTH`` times deeper than any inside them; else None."""
    if rate <= 0 or not chosen:
        return None
    # queue_i = max over j <= i of (tokens j..i) - rate (t_i - t_j): the backlog just
    # after arrival i, the work still waiting from the busy period that began at j.
    cum = np.cumsum(tokens)
    before = cum - tokens - rate * times  # (tokens before j) - rate t_j
    low = np.minimum.accumulate(before)
    queue = cum - rate * times - low
    inside = np.zeros(len(times), dtype=bool)
    for w in chosen:
        inside |= (times >= w.start_s) & (times < w.end_s)
    if inside.all():
        return None
    deepest_inside = float(queue[inside].max()) if inside.any() else 0.0
    peak = int(np.argmax(np.where(inside, -np.inf, queue)))
    if not queue[peak] > BURST_DEPTH * deepest_inside:
        return None
    # From the arrival that began the busy period, so the window sees the queue build
    # (its warm-up sees what came before); the peak stays inside the window.
    began = int(np.flatnonzero(before[:peak + 1] == low[peak])[-1])
    start = max(float(times[began]), float(times[peak]) - length_s / 2)
    return min(start, span - length_s)


P99 = 0.99
"""The quantile a window is judged at (``stats.percentile_ms``: numpy's linear one)."""
HEAVY_RATIO = 1.5
"""How many times longer than the chosen windows' own P99-rank prompt the heaviest
prompts' must be for a window of its own (a window costs a simulation per config; a
prompt about as long is judged there already, on a busier engine)."""


def _p99_prompt(work: np.ndarray) -> float:
    """The prompt at a window's P99 rank: the lower of the two its P99 interpolates
    between (0 without requests)."""
    return float(np.percentile(work, 100 * P99, method="lower")) if len(work) else 0.0


def _heaviest_prompts(times: np.ndarray, work: np.ndarray, starts: np.ndarray,
                      free: np.ndarray, length_s: float) -> tuple[int, float] | None:
    """The one of the ``free`` ``starts`` whose window's P99-rank prompt is the longest,
    and that prompt's ``work``; None without a free window with requests. Of windows
    with equal ones, the one with the most prompts as long past that rank (its P99 reads
    deeper into them; the first of equals).

    Exact without sorting each window (a trace may hold millions of requests, and every
    arrival starts a window): a window's P99-rank prompt is at least ``v`` when at least
    ``n - floor(0.99 (n - 1))`` of its ``n`` requests have at least ``v``, one cumulative
    count per ``v``, and the longest such ``v`` is found by bisection over the trace's
    prompt lengths."""
    lo = np.searchsorted(times, starts, side="left")
    hi = np.searchsorted(times, starts + length_s, side="left")
    n = (hi - lo).astype(np.float64)
    need = np.where(n > 0, n - np.floor(P99 * (n - 1)), np.inf)

    def spare(v: float) -> np.ndarray:
        """Per start, its prompts of ``v``+ tokens past the P99's rank (< 0: short of it)."""
        cum = np.concatenate(([0], np.cumsum(work >= v)))
        return np.where(free, cum[hi] - cum[lo] - need, -np.inf)

    values = np.unique(work)
    if not len(values) or not (spare(float(values[0])) >= 0).any():
        return None
    a, b = 0, len(values) - 1  # values[a] is reached by some window, values[b + 1:] by none
    while a < b:
        mid = (a + b + 1) // 2
        if (spare(float(values[mid])) >= 0).any():
            a = mid
        else:
            b = mid - 1
    v = float(values[a])
    return int(np.argmax(spare(v))), v


KV_EXCESS_RATIO = 2.0
"""How many times more token-seconds over what the KV cache admits the fullest cache's
window must hold than any chosen window for a window of its own. The excess is the
work that waits for room, as a burst's queue is the work that waits for the engine, and
it is held to ``BURST_DEPTH``'s ratio for the same reason: a window costs a simulation
per config, and a cache about as full is judged there already."""


def _fullest_cache(demand: KVDemand, room: float, starts: np.ndarray, free: np.ndarray,
                   chosen: Sequence[WindowChoice], span: float,
                   length_s: float) -> int | None:
    """The index of the one of the ``free`` ``starts`` whose window holds the most
    token-seconds of KV demand over ``room``, when that is ``KV_EXCESS_RATIO`` times what
    any ``chosen`` window holds; else None. Of windows with as much (an excess shorter
    than a window lies whole in many), the middle one: the excess centred, so that an
    estimate a little early or late still has it, and the requests that wait past its
    end (their queue drains after the excess does) are in it too."""
    over = np.where(free, demand.excess(starts, starts + length_s, room), -np.inf)
    own = demand.excess(np.array([w.start_s for w in chosen]),
                        np.array([w.end_s for w in chosen]), room)
    most = float(over.max())
    if not (most > 0 and most > KV_EXCESS_RATIO * float(own.max())):
        return None
    # Windows holding the same excess differ by rounding in the running sums only.
    dust = 1e-9 * (float(demand.excess(np.array([0.0]), np.array([span]), room)[0]) + 1.0)
    ties = np.flatnonzero(over >= most - dust)
    return int(ties[len(ties) // 2])


def trace_windows(records: Sequence[TraceRecord], length_s: float, *, warmup_s: float = 30.0,
                  drain_s: float = 20.0, servable_tokens: int | None = None,
                  residency_s: Sequence[float] | np.ndarray | None = None,
                  kv_admits_tokens: float | None = None) -> list[WindowChoice]:
    """The busiest-by-arrivals, busiest-by-tokens, sharpest-burst, typical,
    heaviest-prompts and fullest-KV-cache windows of ``records`` (sorted by arrival, as
    ``TraceSpec.records`` gives them; see the module docstring for which of them there
    are); one window over the whole replay when it is not longer than two windows.
    ``servable_tokens``: the longest prompt plus output the deployment serves
    (``context_limit``); the heaviest prompts are chosen among those (a longer one is
    refused, and no TTFT counts it). ``residency_s``: each record's seconds in the KV
    cache served without queueing (``lifetimes.residency_s``), and ``kv_admits_tokens``
    the KV tokens the deployment holds before it stops admitting requests (all its
    replicas' caches less their admission watermarks): the fullest cache is looked for
    only given both."""
    if not math.isfinite(length_s) or length_s <= 0:
        raise ValueError(f"length_s={length_s!r}: expected window seconds > 0")
    if not records:
        raise ValueError("records is empty: no window to choose")
    if (residency_s is None) != (kv_admits_tokens is None):
        raise ValueError("residency_s and kv_admits_tokens: give both (the fullest KV "
                         "cache's window needs how long requests stay and what the cache "
                         "admits) or neither")
    if residency_s is not None and len(residency_s) != len(records):
        raise ValueError(f"residency_s: {len(residency_s):,} values for {len(records):,} "
                         "records; expected one per record")
    if kv_admits_tokens is not None and not (math.isfinite(kv_admits_tokens)
                                             and kv_admits_tokens > 0):
        raise ValueError(f"kv_admits_tokens={kv_admits_tokens!r}: expected tokens > 0")
    times = np.fromiter((r.arrival_time for r in records), dtype=np.float64)
    tokens = fresh_tokens(records)
    shared = bool(tokens.sum() < sum(r.prompt_tokens + r.output_tokens for r in records))
    span = float(times[-1]) + 1e-9
    if span <= 2 * length_s:
        # At least a second, as the replay runs (``trace_scenario.with_trace``): a trace
        # whose requests all arrive at once has no span, and n requests over a nanosecond
        # would read as a rate of n * 1e9 req/s.
        whole = max(span, 1.0)
        count, tok = _rates(times, tokens, np.array([0.0]), whole)
        return [WindowChoice("whole trace", 0.0, whole, 0.0, drain_s,
                             arrival_rate=float(count[0]) / whole,
                             token_rate=float(tok[0]) / whole, shared_prefixes=shared)]

    def make(name: str, start: float, count: float, tok: float) -> WindowChoice:
        return WindowChoice(name, start, start + length_s, min(warmup_s, start), drain_s,
                            arrival_rate=float(count) / length_s,
                            token_rate=float(tok) / length_s, shared_prefixes=shared)

    # Candidate starts: every arrival that leaves a whole window before the trace ends.
    starts = times[times + length_s <= span]
    counts, toks = _rates(times, tokens, starts, length_s)
    chosen: list[WindowChoice] = []
    a = int(np.argmax(counts))  # the first of equals: deterministic
    chosen.append(make("busiest arrivals", float(starts[a]), counts[a], toks[a]))

    def clear(start: float) -> bool:
        return all(abs(start - w.start_s) >= length_s / 2 for w in chosen)

    free = np.array([clear(float(s)) for s in starts])
    if free.any():
        t = int(np.argmax(np.where(free, toks, -np.inf)))
        chosen.append(make("busiest tokens", float(starts[t]), counts[t], toks[t]))
    burst = _sharpest_burst(times, tokens, float(toks.max()) / length_s, chosen, span,
                            length_s)
    if burst is not None:
        count, tok = _rates(times, tokens, np.array([burst]), length_s)
        chosen.append(make("sharpest burst", burst, count[0], tok[0]))
    grid = _grid_with_arrivals(times, span, length_s)
    g_counts, g_toks = _rates(times, tokens, grid, length_s)
    # Typical of the traffic, not of the clock: the windows that carry it only. A sparse
    # or bursty trace's median window is empty, and an empty window judges nothing; a
    # diurnal one's median window with arrivals was a night minute of 2 requests
    # ("typical: 0.0 req/s"), where 99 % of its requests arrived in minutes of ~2 req/s.
    busy = _carrying(g_counts)
    if busy.any():
        mc, mt = float(np.median(g_counts[busy])), float(np.median(g_toks[busy]))
        distance = np.abs(g_counts / max(mc, 1e-9) - 1) + np.abs(g_toks / max(mt, 1e-9) - 1)
        # A typical window has room for its whole warm-up where the trace allows one.
        distance = distance + np.where(grid >= warmup_s, 0.0, 1e6)
        for k in np.argsort(distance, kind="stable"):
            if busy[k] and clear(float(grid[k])):
                chosen.append(make("typical", float(grid[k]), g_counts[k], g_toks[k]))
                break
    # What a prompt asks of TTFT: its prefill, the tokens past a shared prefix; its own
    # output comes after its first token.
    output = np.fromiter((r.output_tokens for r in records), dtype=np.float64)
    prompt = tokens - output
    served = np.ones(len(records), dtype=bool) if servable_tokens is None else np.fromiter(
        (r.prompt_tokens + r.output_tokens <= servable_tokens for r in records), dtype=bool)
    own = max(_p99_prompt(prompt[served & (times >= w.start_s) & (times < w.end_s)])
              for w in chosen)
    free = _clear_of(starts, chosen, length_s)
    heavy = _heaviest_prompts(times[served], prompt[served], starts, free, length_s) \
        if free.any() else None
    if heavy is not None and heavy[1] > HEAVY_RATIO * own:
        h = heavy[0]
        chosen.append(dataclasses.replace(make("heaviest prompts", float(starts[h]),
                                               counts[h], toks[h]),
                                          p99_prompt_tokens=heavy[1]))
    if residency_s is not None and kv_admits_tokens is not None:
        # A refused request holds nothing; a served one its whole prompt (a shared
        # prefix too: kv_demand's bound) and its output as it grows.
        prompts = np.fromiter((r.prompt_tokens for r in records), dtype=np.float64)
        demand = KVDemand(times, prompts, output,
                          np.where(served, np.asarray(residency_s, dtype=np.float64), 0.0))
        f = _fullest_cache(demand, kv_admits_tokens, starts,
                           _clear_of(starts, chosen, length_s), chosen, span, length_s)
        if f is not None:
            start = float(starts[f])
            share = demand.peak(start, start + length_s) / kv_admits_tokens
            chosen.append(dataclasses.replace(make("fullest KV cache", start, counts[f],
                                                   toks[f]), kv_share=share))
    return chosen


def seed_windows(first_seed: int, seeds: int, length_s: float, *,
                 drain_s: float = 20.0) -> list[WindowChoice]:
    """``seeds`` runs of a generated workload, each over ``[0, length_s)``."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r}: expected a whole number >= 1")
    if not math.isfinite(length_s) or length_s <= 0:
        raise ValueError(f"length_s={length_s!r}: expected window seconds > 0")
    return [WindowChoice(f"seed {first_seed + k}", 0.0, length_s, 0.0, drain_s,
                         seed=first_seed + k) for k in range(seeds)]
