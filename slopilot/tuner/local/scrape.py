"""When no Prometheus binary is at hand: scrape the replicas' /metrics directly.

``DirectScrape`` polls every replica's ``/metrics`` once a ``interval_s`` on its own
thread and keeps the cumulative series it needs. It is both the demo's AlertReader and
its WindowEvaluator: windows are each replica's counter and bucket increases across the
scrapes from the window's start to its end (``_points`` and ``_increase``: missed
scrapes, restarts, replicas come and gone), the
P99s the same linear interpolation ``histogram_quantile`` does, goodput as the rules read
it (each replica's per-request verdicts under this SLO where it exports them, else its
tokens/s x fraction of TTFTs within the SLO x fraction of gaps within it), the
gauges (busy ratio, waiting requests) as at the window's end, the replicas stalled (requests
in flight at the end, no token made in the window) and down (the last scrape failed) as
the rules count them (``rules.stalled_replicas``, ``rules.targets_down``), the summary
Prometheus' own
builder (``prometheus/query.window_summary``), and the alerts the alert table
(``prometheus/alerts.SummaryAlerts``) evaluated once per rule interval on the trailing window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise

import httpx
from prometheus_client.parser import text_string_to_metric_families

from slopilot.engine.histogram_quantiles import (
    histogram_quantile,
    histogram_share_within,
    judged_copies,
    judged_quantile,
)
from slopilot.engine.meter.exposition import ARRIVALS, INVALID
from slopilot.engine.metric_names import ABANDONED, ARRIVED, AWAITING, REFUSED
from slopilot.engine.request import Priority
from slopilot.engine.sim.correction import WindowSample
from slopilot.engine.sim.shape import FEATURES, KINDS, IterationShape
from slopilot.engine.slo import WITHIN_TTFT_TARGET, SLOSpec
from slopilot.engine.verdicts import SLO_TOKENS
from slopilot.engine.window_summary import Window, WindowSummary
from slopilot.tuner.prometheus.adapters import MIN_WINDOW_REQUESTS
from slopilot.tuner.prometheus.alert_table import latency_thresholds
from slopilot.tuner.prometheus.alerts import Alert, SummaryAlerts
from slopilot.tuner.prometheus.burstiness import (
    BURST_WINDOW_S,
    Burstiness,
    counter_bins,
    unmeasured,
)
from slopilot.tuner.prometheus.latency_sources import BUILTIN_LATENCY
from slopilot.tuner.prometheus.profiling import (
    OUTPUT_TOKENS,
    PREFILLED,
    PROMPT_TOKENS,
    CountedArrivals,
    LengthIncreases,
    WorkloadIncreases,
)
from slopilot.tuner.prometheus.query import window_summary
from slopilot.tuner.prometheus.rules import RuleOptions
from slopilot.tuner.study.evaluator import PrometheusUnavailable, WindowRejected

_TTFT = "vllm:time_to_first_token_seconds_bucket"
_TBT = "vllm:inter_token_latency_seconds_bucket"
_HITS, _QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
_BUSY, _WAITING = "slopilot_busy_ratio", "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
# The requests still waiting for a first token (a gauge, read in the window's last
# scrape): past their TTFT target, in the TTFT's +Inf as the rules read them
# (``rules.bucket_rates``); within it (kept under its own key), only counted as waiting
# (``ClassFigures.requests_awaiting``).
_AWAITING_WITHIN = AWAITING + ":within"
_GAUGES = {_BUSY, _WAITING, _RUNNING, AWAITING, _AWAITING_WITHIN}  # a fall is no restart
_TOKENS = "vllm:generation_tokens_total"
# The requests never given a first token, in the TTFT's +Inf bucket as the rules count
# them (``rules.bucket_rates``): turned away for load, or their client gone before it
# after waiting past its TTFT target.
_NEVER = frozenset(BUILTIN_LATENCY.ttft.engine.never)
# The workload probe's (``scrape_probe``): the token-length histograms whole, the
# prompts of the requests that started (``PREFILLED``, over the first tokens: the TTFT
# histogram's +Inf bucket), the queue (running + waiting) whose growth is arrivals not
# yet finished, and the arrivals a meter in front of a vLLM engine counts (and of them,
# those its engine refused as invalid), or that the built-in engine counts (``ARRIVED``),
# whose raw readings the probe bins for the arrivals' burstiness.
_LENGTHS = {f"{name}_{part}" for name in (PROMPT_TOKENS, OUTPUT_TOKENS)
            for part in ("bucket", "sum", "count")}
_KEEP = {_TTFT, _TBT, REFUSED, ABANDONED, _TOKENS, "vllm:e2e_request_latency_seconds_count",
         "vllm:num_preemptions_total", _HITS, _QUERIES, PREFILLED, ARRIVALS, INVALID, ARRIVED,
         AWAITING, *_LENGTHS, *_GAUGES}
Series = dict[tuple[str, str, float], float]  # (name, priority_class, le or -1) -> value


# The twin check's series, keyed (name, kind or kind/feature, -1) in the same Series.
_NO_LE = -1.0
_STEP_SUM, _STEP_COUNT = "slopilot_iteration_seconds_sum", "slopilot_iteration_seconds_count"
_SHAPE = "slopilot_iteration_shape_total"


def _parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (_STEP_SUM, _STEP_COUNT, _SHAPE):
                label = s.labels.get("kind", "")
                if s.name == _SHAPE:
                    label += "/" + s.labels.get("feature", "")
                key = (s.name, label, _NO_LE)
                out[key] = out.get(key, 0.0) + float(s.value)
            elif s.name == SLO_TOKENS:  # keyed by class, objectives judged and verdict
                key = (s.name, f"{s.labels.get('priority_class', '')}/"
                       f"{s.labels.get('slo', '')}/{s.labels.get('met', '')}", _NO_LE)
                out[key] = out.get(key, 0.0) + float(s.value)
            elif s.name == AWAITING and s.labels.get(WITHIN_TTFT_TARGET) == "true":
                key = (_AWAITING_WITHIN, s.labels.get("priority_class", ""), _NO_LE)
                out[key] = out.get(key, 0.0) + float(s.value)
            elif s.labels.get(WITHIN_TTFT_TARGET) == "true":
                # A client gone within its TTFT target missed nothing: the rules read it
                # as no first token never given (``rules.bucket_rates``).
                continue
            elif s.name in _KEEP:
                # Not NaN for "no le": NaN != NaN, so such a key never matched the
                # window's first snapshot and every counter read as its lifetime.
                le = float(s.labels["le"]) if "le" in s.labels else _NO_LE
                key = (s.name, s.labels.get("priority_class", ""), le)
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """One poll: each replica's series by its URL, and which URL was the canary."""

    series: dict[str, Series]
    canary: str | None
    """The first replica while there are several, as ``LocalDeployment`` orders them."""
    missed: frozenset[str] = frozenset()
    """The replicas deployed whose scrape failed: absent, but not new."""


def _increase(points: list[Series], judge: Callable[[Series], Series] | None = None
              ) -> Series:
    """One replica's increases across its readings in a window, as ``increase()`` reads
    a counter: a fall is a restart, after which the new readings count from zero. The
    restart is the replica's, not one series': a counter that passed its old value
    since is read from zero too, and a histogram's buckets stay one process' counts. A
    series first seen counts from zero; the gauges read their change from the first
    reading to the last. ``judge``: applied to each process' increases before they are
    added (``DirectScrape._judged``): a process restarted in place with an edge its
    predecessor lacked has that edge's counts for part of the window only."""
    out: Series = {}

    def count(last: Series, base: Series) -> None:
        segment = {key: value - base.get(key, 0.0) for key, value in last.items()
                   if key[0] not in _GAUGES}
        for key, value in (judge(segment) if judge else segment).items():
            out[key] = out.get(key, 0.0) + value

    base = points[0] if points else {}
    for old, new in pairwise(points):
        if any(v < old.get(k, -math.inf) and k[0] not in _GAUGES for k, v in new.items()):
            count(old, base)
            base = {}
    if len(points) > 1:
        count(points[-1], base)
        out |= {k: v - points[0].get(k, 0.0) for k, v in points[-1].items() if k[0] in _GAUGES}
    return out


def _points(url: str, window: list[_Snapshot]) -> list[Series]:
    """A replica's readings from the window's first scrape to its last.

    Not deployed at the first (new within the window), it counts from zero there. Deployed
    but its scrape failed (busy, timed out, still starting), it counts from its next
    answer in the window, not from an earlier one: the error is what it served before
    that answer, a part of the window's own traffic and at most the window, where an
    earlier reading adds what it served before the window (a previous config's
    stragglers), as long before as its scrapes failed. Its last answer in the window
    ends it, whether it missed the last scrape or has gone.
    """
    points = [s.series[url] for s in window if url in s.series]
    first = window[0]
    if url not in first.series and url not in first.missed:
        points.insert(0, {})
    return points


def _summed(deltas: Mapping[str, Series]) -> Series:
    out: Series = {}
    for series in deltas.values():
        for key, value in series.items():
            out[key] = out.get(key, 0.0) + value
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> float:
    """``histogram_quantile`` over cumulative ``{le: count}``: NaN when empty."""
    return histogram_quantile(q, buckets)


class DirectScrape:
    def __init__(self, endpoints: Callable[[], list[str]], slo: SLOSpec,
                 options: RuleOptions, *, interval_s: float = 1.0,
                 min_requests: int = MIN_WINDOW_REQUESTS,
                 history_s: float = 600.0, client: httpx.Client | None = None) -> None:
        self.endpoints, self.slo, self.opt = endpoints, slo, options
        self.interval_s, self.min_requests = interval_s, min_requests
        # Long enough for the sustained-breach rows' window too.
        history_s = max(history_s, options.breach_window_s + 2 * interval_s)
        self._snaps: deque[tuple[float, _Snapshot]] = deque(
            maxlen=max(2, int(history_s / interval_s)))
        self._alerts = SummaryAlerts(slo, options)
        self._thresholds = {ttft: latency_thresholds(slo, options, ttft=ttft)
                            for ttft in (True, False)}
        """Per class, what its TTFT (True) and TBT P99s are judged against."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scrape", daemon=True)
        self._client = client or httpx.Client(timeout=max(0.5, interval_s))

    def start(self) -> DirectScrape:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self, now: float | None = None) -> None:
        """Scrape every replica once and keep the snapshot as taken at ``now``."""
        urls = self.endpoints()
        snap: dict[str, Series] = {}
        for url in urls:
            try:
                snap[url] = _parse(self._client.get(url + "/metrics").raise_for_status().text)
            except (httpx.HTTPError, ValueError):
                # A replica starting, stopping or too busy to answer in time, or an error
                # page (not metrics, which ended this thread): its series just pause.
                continue
        # Keyed by URL alone, the role beside it: a replica's role changes when the
        # deployment scales (the only one becomes the canary), and keyed by role its
        # whole history read as the window's.
        canary = urls[0] if len(urls) > 1 else None
        with self._lock:
            self._snaps.append((time.time() if now is None else now,
                                _Snapshot(snap, canary, frozenset(urls) - snap.keys())))

    def _at(self, t: float) -> _Snapshot | None:
        with self._lock:
            before = [s for ts, s in self._snaps if ts <= t]
        return before[-1] if before else None

    def _window(self, start: float, end: float) -> list[_Snapshot]:
        """The snapshots from the last at or before ``start`` to the last at or before
        ``end``; none where the scrapes do not reach back to ``start``."""
        with self._lock:
            inside = [(t, s) for t, s in self._snaps if t <= end]
        first = [i for i, (t, _) in enumerate(inside) if t <= start]
        return [s for _, s in inside[first[-1]:]] if first else []

    def _deltas(self, start: float, end: float, canary: bool, judged: bool = False
                ) -> dict[str, Series]:
        """Each replica's increases over the window (``_increase`` of ``_points``), by
        its URL: every replica that answered a scrape of it, or the canary at its end;
        ``judged``, each of its processes read at every threshold (``_judged``)."""
        window = self._window(start, end)
        urls = dict.fromkeys(url for s in window for url in s.series)
        judge = self._judged if judged else None
        return {url: _increase(_points(url, window), judge) for url in urls
                if not canary or url == window[-1].canary}

    def _delta(self, start: float, end: float, canary: bool) -> Series:
        """Every replica's series over the window, summed."""
        return _summed(self._deltas(start, end, canary))

    def iterations(self, start: float, end: float) -> list[WindowSample]:
        """IterationSource: every replica's iteration series between two snapshots."""
        d = self._delta(start, end, canary=False)
        out = []
        for kind in KINDS:
            n = d.get((_STEP_COUNT, kind, _NO_LE), 0.0)
            if n <= 0:
                continue
            shape = IterationShape(*(d.get((_SHAPE, f"{kind}/{f}", _NO_LE), 0.0)
                                     for f in FEATURES))
            out.append(WindowSample(kind, n, d.get((_STEP_SUM, kind, _NO_LE), 0.0), shape))
        return out

    def workload(self, start: float, end: float) -> WorkloadIncreases:
        """WorkloadProbe's evidence: every replica's increases over the window of the
        series ``WorkloadProfile.measure`` reads from PromQL (its queue's growth, a
        gauge, the change across each replica's readings, as ``_increase`` reads them;
        the arrivals of a replica that exports the meter's count, less those its engine
        refused as invalid, ``CountedArrivals``, as ``counted_arrivals`` reads them).
        None at all where the scrapes do not reach back to ``start`` yet: too little to
        profile, as a quiet window.

        Raises PrometheusUnavailable where no replica answered the last scrape by
        ``end``: no quiet deployment, but one whose metrics stopped reaching the scrape.
        """
        a, b = self._at(start), self._at(end)
        if b is None or not b.series:
            raise PrometheusUnavailable(
                "no replica answered the scrape of its /metrics by the window's end: no "
                "workload to measure, and no scale is planned on no evidence")
        empty = LengthIncreases({}, 0.0, 0.0)
        if a is None:
            return WorkloadIncreases({}, {}, empty, empty, 0.0)
        replicas = self._deltas(start, end, canary=False)
        d = _summed(replicas)

        def by_class(name: str, d: Series = d) -> dict[str, float]:
            out: dict[str, float] = {}
            for (n, c, _), v in d.items():
                if n == name:
                    out[c] = out.get(c, 0.0) + v
            return out

        def growth(d: Series) -> float:
            return sum(v for (n, _, _), v in d.items() if n in (_RUNNING, _WAITING))

        def length(name: str) -> LengthIncreases:
            buckets: dict[float, float] = {}
            for (n, _, le), v in d.items():
                if n == f"{name}_bucket":
                    buckets[le] = buckets.get(le, 0.0) + v
            return LengthIncreases(buckets, sum(by_class(f"{name}_sum").values()),
                                   sum(by_class(f"{name}_count").values()))

        counted = None
        metered = {url for url, r in replicas.items() if any(k[0] == ARRIVALS for k in r)}
        if metered:
            others = _summed({url: r for url, r in replicas.items() if url not in metered})
            arrived: dict[str, float] = {}
            for url in metered:
                invalid = by_class(INVALID, replicas[url])
                for c, n in by_class(ARRIVALS, replicas[url]).items():
                    # Each replica's off its own, none below 0: a request that came
                    # before the window and was refused in it. NaN kept, for the check.
                    served = n - invalid.get(c, 0.0)
                    arrived[c] = arrived.get(c, 0.0) + (0.0 if served < 0 else served)
            counted = CountedArrivals(
                arrived=arrived, others_finished=by_class(
                    f"{PROMPT_TOKENS}_count", others), others_refused=by_class(REFUSED, others),
                others_queue_growth=growth(others))
        return WorkloadIncreases(
            finished=by_class(f"{PROMPT_TOKENS}_count"), refused=by_class(REFUSED),
            prompt=length(PROMPT_TOKENS), output=length(OUTPUT_TOKENS),
            queue_growth=growth(d),
            started=sum(v for (n, _, le), v in d.items() if n == _TTFT and math.isinf(le)),
            started_prompt=sum(by_class(PREFILLED).values()), counted=counted,
            burstiness=self.burstiness(end - max(end - start, BURST_WINDOW_S), end))

    def burstiness(self, start: float, end: float) -> Burstiness:
        """The arrivals' burstiness over ``(start, end]`` from each replica's readings of
        its arrivals counter (the meter's, else the built-in engine's; every class's
        summed), binned as Prometheus' raw samples are (``burstiness.counter_bins``)."""
        with self._lock:
            snaps = [(t, s) for t, s in self._snaps if start < t <= end]
        series: dict[str, list[tuple[float, float]]] = {}
        for t, snap in snaps:
            for url, got in snap.series.items():
                name = ARRIVALS if any(k[0] == ARRIVALS for k in got) else ARRIVED
                count = [v for k, v in got.items() if k[0] == name]
                if count:
                    # The meter's invalid ones (a client's 400s) are no load, as the
                    # Prometheus probe takes them off; each was an arrival first, so
                    # the difference never falls.
                    invalid = sum(v for k, v in got.items() if k[0] == INVALID) \
                        if name == ARRIVALS else 0.0
                    series.setdefault(url, []).append((t, sum(count) - invalid))
        if not series:
            return unmeasured(f"no replica exports an arrivals counter ({ARRIVALS} or "
                              f"{ARRIVED})")
        return counter_bins(list(series.values()), start, end)

    def _gauges(self, end: float, canary: bool) -> dict[str, float | None]:
        """Busy ratio (mean and max over replicas) and waiting requests (sum) in the last
        scrape."""
        snap = self._at(end) or _Snapshot({}, None)
        busy, waiting = [], []
        for url, series in snap.series.items():
            if canary and url != snap.canary:
                continue
            for (name, _, _), value in series.items():
                if name == _BUSY:
                    busy.append(value)
                elif name == _WAITING:
                    waiting.append(value)
        return {"busy_ratio": sum(busy) / len(busy) if busy else None,
                "busy_ratio_max": max(busy) if busy else None,
                "requests_waiting": sum(waiting) if waiting else None}

    def _awaiting(self, end: float, canary: bool
                  ) -> tuple[dict[str, float], dict[str, float]]:
        """Each class's requests given no first token yet in the last scrape by ``end``
        (``ClassFigures.requests_awaiting``), and of them those past their TTFT target,
        as the rules read the gauge (``last_over_time``); empty where no replica
        exports it."""
        snap = self._at(end) or _Snapshot({}, None)
        waiting: dict[str, float] = {}
        past: dict[str, float] = {}
        for url, series in snap.series.items():
            if canary and url != snap.canary:
                continue
            for (name, cls, _), value in series.items():
                if name in (AWAITING, _AWAITING_WITHIN):
                    waiting[cls] = waiting.get(cls, 0.0) + value
                if name == AWAITING:
                    past[cls] = past.get(cls, 0.0) + value
        return waiting, past

    def _judged(self, series: Series) -> Series:
        """One process' increases, with a copy of its TTFT and gap buckets at each
        threshold of any class that its edges hold strictly inside (``judged_copies``),
        in every class: summed as they are, a replica started with the SLO (its edge at
        the threshold) beside one started before an edit of it (none there) read a P99
        of 859 ms for first tokens all within 800 ms, and so did a replica restarted in
        place since the edit, read as one process. Each is read as its own edges allow,
        as the rules read them (``rules.judged_rates``)."""
        out = dict(series)
        for name, ttft in ((_TTFT, True), (_TBT, False)):
            values = {t for ts in self._thresholds[ttft].values() for t in ts}
            for cls in {c for (n, c, _) in series if n == name}:
                buckets = {le: v for (n, c, le), v in series.items() if n == name and c == cls}
                for t, count in judged_copies(buckets, values).items():
                    out[(name, cls, t)] = count
        return out

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        return self._summary(start, end, canary, self.min_requests)

    def _summary(self, start: float, end: float, canary: bool,
                 min_requests: int) -> WindowSummary:
        replicas = self._deltas(start, end, canary)
        d = _summed(self._deltas(start, end, canary, judged=True))
        span = max(1e-9, end - start)
        labels = {p.label for p in Priority}

        def by_class(name: str) -> dict[str, float]:
            out: dict[str, float] = {}
            for (n, c, _), v in d.items():
                if n == name and c in labels:
                    out[c] = out.get(c, 0.0) + v
            return out

        waiting, past = self._awaiting(end, canary)

        def buckets(name: str, cls: str | None) -> dict[float, float]:
            """Cumulative ``{le: count}`` of one class, or of every class (None); for
            TTFT, each request never given a first token (turned away for load, or its
            client gone before it, or still waiting for it past its target at the end)
            in +Inf (``rules.bucket_rates``)."""
            out: dict[float, float] = {}
            never = sum(v for c, v in past.items() if c == cls or cls is None)
            for (n, c, le), v in d.items():
                if c == cls or (cls is None and c in labels):
                    if n == name:
                        out[le] = out.get(le, 0.0) + v
                    elif n in _NEVER:
                        never += v
            if name == _TTFT and math.inf in out:  # as PromQL's join: where +Inf is
                out[math.inf] += never
            return out

        requests = by_class("vllm:e2e_request_latency_seconds_count")
        finished = sum(requests.values())
        if finished < min_requests:
            raise WindowRejected(f"only {finished:.0f} requests finished in the "
                                 f"{span:.0f} s window; need {min_requests}")
        queries = sum(v for (n, _, _), v in d.items() if n == _QUERIES)
        hits = sum(v for (n, _, _), v in d.items() if n == _HITS)
        tokens = by_class("vllm:request_generation_tokens_sum")
        goodput = {p.label: sum(self._good_tokens(r, p) for r in replicas.values()) / span
                   for p in Priority}
        return window_summary(
            requests=requests, refused=by_class(REFUSED),
            throughput={c: v / span for c, v in tokens.items()},
            # Judged as the rules judge them (``judged_quantile``): no threshold of the
            # alert table claimed breached that the buckets cannot prove.
            ttft_p99_s={p.label: judged_quantile(0.99, buckets(_TTFT, p.label),
                                                 self._thresholds[True].get(p.label, ()))
                        for p in Priority},
            # Its +Inf: every observation the P99 ranks, those never given a first token too.
            ttft_samples={p.label: buckets(_TTFT, p.label).get(math.inf, 0.0)
                          for p in Priority},
            tbt_p99_s={p.label: judged_quantile(0.99, buckets(_TBT, p.label),
                                                self._thresholds[False].get(p.label, ()))
                       for p in Priority},
            goodput=goodput,
            preemptions_per_min=sum(v for (n, _, _), v in d.items()
                                    if n == "vllm:num_preemptions_total") * 60 / span,
            overall_ttft_p99_s=quantile(0.99, buckets(_TTFT, None)),
            overall_tbt_p99_s=quantile(0.99, buckets(_TBT, None)),
            awaiting=waiting or None,
            duration_s=span, window=Window(start, end, canary), **self._gauges(end, canary),
            prefix_cache_hit_ratio=hits / queries if queries > 0 else None,
            **self._unwell(replicas, end, canary))

    def _unwell(self, replicas: Mapping[str, Series], end: float, canary: bool
                ) -> dict[str, float | None]:
        """The replicas stalled and down at ``end`` (None without a scrape by then): a
        stalled one held requests waiting or running at its last scrape and made no token
        in the window (``replicas``: each one's increases over it); one down is deployed
        and its last scrape failed, and none deployed at all counts 1, as the rules'
        ``absent(up)``."""
        snap = self._at(end)
        if snap is None:
            return {"stalled_replicas": None, "targets_down": None}
        series = {url: s for url, s in snap.series.items() if not canary or url == snap.canary}
        missed = [url for url in snap.missed if not canary or url == snap.canary]
        stalled = sum(
            1 for url, s in series.items()
            if sum(v for (n, _, _), v in s.items() if n in (_RUNNING, _WAITING)) > 0
            and replicas.get(url, {}).get((_TOKENS, "", _NO_LE), 0.0) <= 0)
        down = len(missed) if series or missed else 1
        return {"stalled_replicas": float(stalled), "targets_down": float(down)}

    def _good_tokens(self, d: Series, p: Priority) -> float:
        """One replica's good tokens of class ``p`` in the window, as the rules count
        them: its tokens times the share of those it judged under this SLO that met it,
        where it judged any, else times its shares of first tokens and of gaps within
        the SLO."""
        c, cls_slo = p.label, self.slo.class_slo(p)
        good = d.get(("vllm:request_generation_tokens_sum", c, _NO_LE), 0.0)
        met, missed = (d.get((SLO_TOKENS, f"{c}/{cls_slo.label}/{v}", _NO_LE), 0.0)
                       for v in ("true", "false"))
        if met + missed > 0:
            return good * met / (met + missed)
        for name, limit in ((_TTFT, cls_slo.ttft_p99_ms), (_TBT, cls_slo.tbt_p99_ms)):
            hist = {le: v for (n, cls, le), v in d.items() if n == name and cls == c}
            if limit is not None and hist.get(math.inf, 0.0) > 0:
                good *= histogram_share_within(limit / 1000, hist)
        return good

    def _summary_at(self, t: float, window_s: float) -> WindowSummary | None:
        # No request minimum: a recording rule has none, and a stall in which few
        # requests finish is when the TBT and batching alerts must fire. A figure with
        # no samples is None, which no condition holds on, as a NaN series in Prometheus.
        return self._summary(t - window_s, t, False, 0)

    def firing(self, now: float | None = None) -> list[Alert]:
        """The alerts firing at ``now`` (the wall clock by default, as ``poll``'s)."""
        return self._alerts.firing(time.time() if now is None else now, self._summary_at)
