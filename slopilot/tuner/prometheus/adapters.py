"""The controller's window and workload ports over a real Prometheus.

The real-world twins of ``sim/adapters.py``'s ``SimWindows`` and ``SimProbe``. A window
``[start, end]`` is read with instant queries evaluated *at* ``end`` whose ranges span
``end - start`` (``/api/v1/query?time=end``), so a window that finished a while ago reads
the same as when it ended. The expressions are the deployment's recording rules
(``rules.render_rule_groups``) rendered with the window as the rate range, so a trial is
judged on exactly what the alerts watch. ``canary=True`` narrows the selector to the
canary replica: the ``instance_role`` label ``LocalDeployment``'s targets file puts on
its series, or (the operator) a callable naming the canary pod's ``pod`` label now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from slopilot.engine.meter.exposition import METER_REFUSED, METER_START
from slopilot.engine.metric_names import BUSY, PROCESS_START, REFUSED
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import Window, WindowSummary
from slopilot.tuner.prometheus.alert_table import MAX_DURATION_S, latency_thresholds
from slopilot.tuner.prometheus.profiling import (
    WorkloadProfile,
    check_probe,
    counted_arrivals,
    profiled_or_base,
    unmetered,
)
from slopilot.tuner.prometheus.query import QueryAt, query_at, window_summary
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    LatencySources,
    RuleOptions,
    awaiting_count,
    duration,
    latency_count,
    latency_quantile,
    render_rule_groups,
    render_selector,
)
from slopilot.tuner.prometheus.scrape_interval import (
    MAX_SCRAPE_INTERVAL_S,
    ScrapeInterval,
    scrape_interval,
)
from slopilot.tuner.prometheus.window_edges import Ending, WindowEdges
from slopilot.tuner.study.evaluator import (
    PrometheusUnavailable,
    QueueReading,
    ReplicaRestarted,
    WindowRejected,
)

ROLE_LABEL = "instance_role"
REPLICA_LABEL = "instance"
"""What tells one replica's series from another's: Prometheus's own target label, on
every series of a scrape target (a pod in Kubernetes, a process of ``LocalDeployment``)."""
MIN_SCRAPED_SHARE = 0.75
"""A replica measured must have answered at least this share of the window's scrapes: one
failed scrape in four is noise (a counter loses nothing to a gap in the middle), fewer
may leave a quarter of its window in no figure."""
MIN_REPLICA_SAMPLES = 2
"""The samples each replica's engine series must hold in a window: rate() and increase()
read nothing of fewer."""
CANARY = {ROLE_LABEL: "canary"}
_QUANTILES = {"ttft": "slopilot:ttft_seconds:p99", "tbt": "slopilot:tbt_seconds:p99"}
_GOODPUT = "slopilot:goodput_tokens:per_second"
_PREEMPT = "slopilot:preemptions:per_minute"


def busy_window(selector: str, window: str) -> tuple[str, str]:
    """The replicas' busy ratio over ``window``, mean and busiest: the share of every
    replica's time there that its executor ran (each one's readings summed, over their
    count: each weighs for the scrapes it answered there), and the busiest replica's
    share of its own time there. A replica with fewer than ``MIN_REPLICA_SAMPLES``
    readings there is in neither, as it is in no rate."""
    series = f"{BUSY}{selector}[{window}]"
    counted = f"(count_over_time({series}) >= {MIN_REPLICA_SAMPLES})"
    return (f"sum(sum_over_time({series}) and {counted}) / sum({counted})",
            f"max(avg_over_time({series}) and {counted})")


def range_s(start: float, end: float) -> int:
    """The whole seconds of PromQL's range over ``[start, end]`` (at least 2)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end - start < 2:
        raise WindowRejected(f"window [{start:.1f}, {end:.1f}] is shorter than 2 s: too "
                             "short for a rate over even 1 s scrapes")
    return int(end - start)


QUEUE_RATE_S = 60
"""The arrivals a trial's backlog wait scales its steady queue by: the last minute's, as
the workload probe reads them."""
MIN_WINDOW_REQUESTS = 10
"""The finished requests a window needs to count (``PrometheusWindows``, as the operator
runs it, and the demo's direct scrape): a P99 of fewer is hardly more than their
maximum."""


class PrometheusWindows:
    """WindowEvaluator: the ``WindowSummary`` of ``[start, end]`` read from Prometheus.

    ``min_requests``: fewer finished requests in the window -> WindowRejected. So does a
    replica measured (every replica, or the canary) that Prometheus scraped in the window
    but that left no series in it: the others' figures are not the deployment's.
    ``load_tolerance``: the arrival rate of the window moved from the window of the same
    length just before it by a ratio beyond ``1 + load_tolerance`` either way (0.5: above
    1.5x or below 1/1.5x) -> WindowRejected (a trial compared under a different load is
    not comparable). The same ratio both ways: a fall flatters a trial as much as a rise
    condemns it, and ``|rate/before - 1|`` rejected a 1.9x rise but took a fall to half.
    ``min_rate_for_check`` skips that check when the earlier window was (nearly) idle: a
    start from nothing is not a shift.
    ``latency``: the backend's TTFT and TBT sources, as the recording rules are rendered
    with (``render_rule_groups``): on vLLM the meter's client-side P99s, and vLLM's edges
    for its goodput (without them an SLO between two of vLLM's edges selects a bucket it
    never exports, and the goodput reads nothing).
    ``max_scrape_interval_s``: the longest scrape interval the deployment's rules read
    (``RuleOptions.max_scrape_interval_s``), past which ``scrape_interval`` says so.
    """

    def __init__(self, query: QueryAt | str, selector: Mapping[str, str], slo: SLOSpec, *,
                 canary_labels: Mapping[str, str] | Callable[[], Mapping[str, str]] = CANARY,
                 min_requests: int = MIN_WINDOW_REQUESTS,
                 load_tolerance: float = 0.5, min_rate_for_check: float = 0.2,
                 latency: LatencySources = BUILTIN_LATENCY,
                 max_scrape_interval_s: float = MAX_SCRAPE_INTERVAL_S) -> None:
        if not selector:
            raise ValueError("selector is empty: it would mix every engine in Prometheus; "
                             "pass the deployment's labels, e.g. {'slopilot_deployment': 'x'}")
        render_selector(selector)
        if not callable(canary_labels):
            render_selector(canary_labels)
        if isinstance(min_requests, bool) or not isinstance(min_requests, int) \
                or min_requests < 1:
            raise ValueError(f"min_requests={min_requests!r}: expected a count >= 1")
        if not load_tolerance > 0:
            raise ValueError(f"load_tolerance={load_tolerance!r}: expected a ratio > 0, e.g. "
                             "0.5 for request rates within 1.5x of each other either way")
        self.query = query_at(query) if isinstance(query, str) else query
        self.selector = dict(selector)
        self.canary_labels = canary_labels if callable(canary_labels) else dict(canary_labels)
        self.slo = slo
        self.min_requests = min_requests
        self.load_tolerance = load_tolerance
        self.min_rate_for_check = min_rate_for_check
        self.latency = latency
        self.max_scrape_interval_s = max_scrape_interval_s

    def _selector(self, canary: bool) -> dict[str, str]:
        if not canary:
            return dict(self.selector)
        labels = self.canary_labels() if callable(self.canary_labels) else self.canary_labels
        if not labels:
            raise WindowRejected("no canary replica is ready to measure")
        return {**self.selector, **labels}

    def _exprs(self, sel: Mapping[str, str], window_s: int) -> dict[str, dict[str | None, str]]:
        # The rules rendered with the window as their rate range; the alerts' breach window
        # is no figure of a window, and kept at least as long so a trial extended past it
        # (``max_trial_s``, 20 min) renders at all.
        options = RuleOptions(rate_window_s=window_s,
                              breach_window_s=max(window_s, RuleOptions().breach_window_s))
        groups = render_rule_groups(self.slo, "window", selector=sel, options=options,
                                    latency=self.latency)
        out: dict[str, dict[str | None, str]] = {}
        for rule in groups["groups"][0]["rules"]:
            if "record" in rule:
                out.setdefault(rule["record"], {})[rule["labels"].get("priority_class")] = \
                    rule["expr"]
        w, s = duration(window_s), render_selector(sel)
        out["requests"] = {None: f"sum by (priority_class) (increase("
                                 f"vllm:e2e_request_latency_seconds_count{s}[{w}]))"}
        # Turned away, by class: the built-in engine's (429s, and 503s at its connection
        # cap), or the meter's 503s at its cap in front of vLLM (which refuses nothing).
        # A deployment has one of them: either alone is read where the other is absent.
        engine, meter = (f"sum by (priority_class) (increase({name}{s}[{w}]))"
                         for name in (REFUSED, METER_REFUSED))
        out["refused"] = {None: f"({engine} + {meter} or {engine} or {meter})"}
        # What each class's TTFT P99 rests on, for the floor of requests a verdict needs:
        # on vLLM the meter's streams where it saw any, which may be few of the finished.
        out["ttft_samples"] = {None: latency_count(self.latency.ttft, s, w)}
        # The requests still waiting for a first token at the window's end: a class sent
        # traffic that its config starves (``ClassFigures.requests_awaiting``).
        if (waiting := awaiting_count(self.latency.ttft, s, w)) is not None:
            out["awaiting"] = {None: waiting}
        # The built-in engine's busy ratio (its own sliding share of wall time) over the
        # window; vLLM exports none (not measured). Each replica counts for the time it
        # was there, as in the rates: the mean of every replica's samples, not of each
        # one's last (a replica come up 85 s before the end of 300 s weighed as much as
        # one there all along, one gone early read as of when it went). One with a
        # single sample is left out, as of the rates (``thinly_scraped``).
        mean, busiest = busy_window(s, w)
        out["busy_avg"], out["busy_max"] = {None: mean}, {None: busiest}
        out["throughput"] = {None: f"sum by (priority_class) (rate("
                                   f"vllm:request_generation_tokens_sum{s}[{w}]))"}
        # Every class together, as the simulator's overall P99 (no recording rule has it).
        # Read at every class's thresholds, as the classes' own (``judged_buckets``):
        # without, a fleet of replicas started with and before an SLO edit summed one's
        # edge at 800 ms with nothing, and first tokens all at 795 ms read 859 ms.
        for key, source, ttft in (("ttft", self.latency.ttft, True),
                                  ("tbt", self.latency.tbt, False)):
            out[f"{key}_p99_all"] = {None: latency_quantile(
                0.99, source, s, w, by="le",
                thresholds=latency_thresholds(self.slo, options, ttft=ttft))}
        # Arrivals, not completions: a bad config slows completions, and that must read as
        # a bad trial, not as a load shift. Arrivals = finished + growth of the queue +
        # turned away for load: a config that refuses its clients took less, it was not
        # offered less (and the simulated cluster counts them, as every arrival).
        # The replicas Prometheus scraped in the window (``up``, one series per target,
        # kept where a scrape fails) that left no engine series in it: their requests are
        # in no figure, and what the others report would be judged as the whole
        # deployment's (or as the canary's). The gauge, not a request counter: both
        # backends export it from the start, a replica that served nothing too.
        out["unreported"] = {None: (
            f"max by ({REPLICA_LABEL}) (max_over_time(up{s}[{w}])) unless on "
            f"({REPLICA_LABEL}) count by ({REPLICA_LABEL}) (last_over_time("
            f"vllm:num_requests_running{s}[{w}]))")}
        # The replicas that answered only part of the window's scrapes: a counter loses
        # nothing to a gap in the middle, but one that stops (or starts) answering
        # part-way leaves the rest of the window in no figure, as rate() extrapolates
        # at most half an interval past its last sample. A target scaled away has no
        # ``up`` after it (not 0), so it is not counted here.
        out["partly_scraped"] = {None: (
            f"avg by ({REPLICA_LABEL}) (avg_over_time(up{s}[{w}])) < {MIN_SCRAPED_SHARE}")}
        # The replicas whose process started again in the window, in place (the same
        # pod, the same target): their counters began again at 0 and, once past their
        # old values by the next scrape, read to Prometheus as no reset, so increase()
        # took the difference and the requests of the restart's side went missing. The
        # engine's start (prometheus_client's process collector, as vLLM's default
        # registry exports it too), or a vLLM pod's meter's, whose histograms are the
        # P99s there.
        out["restarted"] = {None: " or ".join(
            f"max by ({REPLICA_LABEL}) (changes({series}{s}[{w}])) > 0"
            for series in (PROCESS_START, METER_START))}
        # The replicas whose engine series hold fewer than two samples in the window: a
        # rate or increase of one sample is nothing, so their requests are in no figure,
        # though their one ``up`` reads 1 and their one sample counts as reported (a
        # window of under two scrape intervals, or a replica that came up at its end).
        out["thinly_scraped"] = {None: (
            f"min by ({REPLICA_LABEL}) (count_over_time("
            f"vllm:num_requests_running{s}[{w}])) < {MIN_REPLICA_SAMPLES}")}
        # Arrivals: counted by the meters in front of vLLM engines (vLLM's own series drop
        # a request whose client gave up: the overload the loop acts on read calmer),
        # less those each one's engine refused as invalid, and estimated for the replicas
        # without the count as finished + queue growth + turned away. Each empty where no
        # replica is of its kind (``_request_rate``).
        others = unmetered(s, w)
        out["arrival_rate"] = {None: f"sum({counted_arrivals(s, w, 'rate')})"}
        out["request_rate"] = {None: (
            f"sum(rate(vllm:e2e_request_latency_seconds_count{s}[{w}]){others}) + "
            f"((sum(delta(vllm:num_requests_running{s}[{w}]){others}) + "
            f"sum(delta(vllm:num_requests_waiting{s}[{w}]){others})) / {window_s} "
            f"or vector(0)) + (sum(rate({REFUSED}{s}[{w}]){others}) or vector(0))")}
        return out

    def _by_class(self, expr: str, at: float) -> dict[str, float]:
        return {s["metric"].get("priority_class", ""): float(s["value"][1])
                for s in self.query(expr, at)}

    def _scalar(self, expr: str, at: float) -> float:
        result = self.query(expr, at)
        return float(result[0]["value"][1]) if result else math.nan

    def _request_rate(self, q: Mapping[str, Mapping[str | None, str]], at: float) -> float:
        """Arrivals per second: the meters' count plus the others' estimate (NaN where
        neither has data)."""
        parts = [v for v in (self._scalar(q["arrival_rate"][None], at),
                             self._scalar(q["request_rate"][None], at)) if math.isfinite(v)]
        return sum(parts) if parts else math.nan

    def request_rate(self, start: float, end: float, *, canary: bool) -> float:
        """Arriving requests per second in ``[start, end]`` (NaN with no data)."""
        w = range_s(start, end)
        return self._request_rate(self._exprs(self._selector(canary), w), end)

    def queue(self, at: float, *, canary: bool) -> QueueReading | None:
        """``QueueGauge``: the requests waiting at ``at`` (vLLM's gauge, summed over the
        replicas measured) and the arrivals a second over the ``QUEUE_RATE_S`` before;
        None where no replica exports the gauge or no arrival rate reads."""
        sel = self._selector(canary)
        waiting = self._scalar(f"sum(vllm:num_requests_waiting{render_selector(sel)})", at)
        rate = self._request_rate(self._exprs(sel, QUEUE_RATE_S), at)
        if not (math.isfinite(waiting) and math.isfinite(rate)):
            return None
        return QueueReading(waiting=waiting, arrivals_per_s=rate)

    def scrape_interval(self, at: float | None) -> ScrapeInterval | None:
        """The slowest scrape interval of the deployment's targets before ``at`` (None:
        Prometheus's now), as ``scrape_interval.scrape_interval`` reads it."""
        return scrape_interval(self.query, self.selector, at, self.max_scrape_interval_s)

    def _measured(self, end: float) -> ScrapeInterval | None:
        """``scrape_interval`` at ``end``; None where Prometheus does not answer it."""
        try:
            return self.scrape_interval(end)
        except PrometheusUnavailable:
            return None

    def _slow_scrapes(self, end: float) -> str:
        """What a window thin or partly scraped owes to a scrape interval the rules
        cannot read (``; ...``), or nothing."""
        found = self._measured(end)
        return f"; {found.problem()}" if found is not None and found.too_long else ""

    def measure(self, start: float, end: float, *, canary: bool) -> WindowSummary:
        # A day at most, as the rules read: a trial's window may run to maxTrial (a day
        # at most) and its tick come a few seconds past it.
        w = range_s(max(start, end - MAX_DURATION_S), end)
        q = self._exprs(self._selector(canary), w)
        if unreported := sorted(r["metric"].get(REPLICA_LABEL, "?")
                                for r in self.query(q["unreported"][None], end)):
            which, whose = (("the canary replica", "the canary's") if canary else
                            ("replica(s)", "the deployment's"))
            raise WindowRejected(f"{which} {', '.join(unreported)} scraped but no series "
                                 f"in the {w} s window (scrapes failing, or restarted): "
                                 f"the others' figures are not {whose}")
        if partly := sorted((r["metric"].get(REPLICA_LABEL, "?"), float(r["value"][1]))
                            for r in self.query(q["partly_scraped"][None], end)):
            which = "the canary replica" if canary else "replica(s)"
            shown = ", ".join(f"{i} answered {share * 100:.0f} %" for i, share in partly)
            raise WindowRejected(
                f"{which} {shown} of its scrapes in the {w} s window (at least "
                f"{MIN_SCRAPED_SHARE * 100:g} % needed): part of its window is in no figure"
                f"{self._slow_scrapes(end)}")
        if again := sorted(r["metric"].get(REPLICA_LABEL, "?")
                           for r in self.query(q["restarted"][None], end)):
            which = "the canary replica" if canary else "replica(s)"
            raise ReplicaRestarted(
                f"{which} {', '.join(again)} restarted in the {w} s window: its counters "
                "began again from 0, and what it served before (or after) the restart is "
                "in no figure once they passed their old values", replicas=again)
        edges = WindowEdges(self.query, render_selector(self._selector(canary)), w, end,
                            self.max_scrape_interval_s, lambda: self._measured(end))
        thin = sorted((r["metric"].get(REPLICA_LABEL, "?"), float(r["value"][1]))
                      for r in self.query(q["thinly_scraped"][None], end))
        # A pod that joined or left inside a long window, one sample there: left out of the
        # deployment's where what it served there is a small share (window_edges.py).
        if thin and (canary or not edges.thin_left_out([i for i, _ in thin])):
            which = "the canary replica" if canary else "replica(s)"
            shown = ", ".join(f"{i} left {n:.0f} sample{'s' if n != 1 else ''}"
                              for i, n in thin)
            raise WindowRejected(
                f"{which} {shown} in the {w} s window (at least {MIN_REPLICA_SAMPLES} "
                "needed: a rate of one is nothing, so its requests are in no figure); "
                f"{edges.thin_reason([i for i, _ in thin], canary)}"
                f"{self._slow_scrapes(end)}")
        # Gone before the end: the canary's rates over the whole window read low; a
        # replica whose scrapes failed (still failing, or until its target went) served on
        # in no figure. One scaled away counts in the deployment's for the time it served.
        if stopped := [(i, ending) for i, ending in edges.stopped()
                       if canary or ending.unseen]:
            which = "the canary replica" if canary else "replica(s)"
            if canary:
                why = ("(its target gone, or its scrapes failing): its rates over the whole "
                       "window would spread what it served over all of it, and read low")
            elif all(e is Ending.FAILING for _, e in stopped):
                why = ("while still a target (its scrapes fail since): what it served since "
                       "is in no figure")
            else:
                why = ("while it served on: its scrapes failed before its target went (or "
                       "fail still), and what it served since its last good scrape is in "
                       "no figure; the next window, after the replacement, reads")
            raise WindowRejected(
                f"{which} {', '.join(i for i, _ in stopped)} left no engine sample in the "
                f"last {edges.tail_s()} s of the {w} s window {why}"
                f"{self._slow_scrapes(end)}")
        # Come up after the start: the canary's rates over the whole window read low, as
        # one gone before the end. A replica the deployment gained counts in its figures
        # for the time it served, as one it lost.
        if canary and (started := edges.started()):
            raise WindowRejected(
                f"the canary replica {', '.join(started)} left no engine sample in the "
                f"first {edges.tail_s()} s of the {w} s window (it came up inside it): its "
                "rates over the whole window would spread what it served over all of it, "
                "and read low; the next window, with the canary there all along, reads"
                f"{self._slow_scrapes(end)}")
        requests = self._by_class(q["requests"][None], end)
        finished = sum(v for v in requests.values() if math.isfinite(v))
        if finished < self.min_requests:
            where = "on the canary " if canary else ""
            raise WindowRejected(f"only {finished:.0f} requests finished {where}in the {w} s "
                                 f"window; need {self.min_requests}")
        rate = self._request_rate(q, end)
        before = self._request_rate(q, end - w)
        bound = 1.0 + self.load_tolerance
        if math.isfinite(before) and before >= self.min_rate_for_check and \
                math.isfinite(rate) and not 1.0 / bound <= rate / before <= bound:
            raise WindowRejected(f"request rate moved from {before:.3g}/s to {rate:.3g}/s "
                                 f"(beyond {bound:.3g}x either way): the window is not "
                                 "comparable")
        p99 = {key: self._by_class(q[rec][None], end) for key, rec in _QUANTILES.items()}
        goodput = {c: self._scalar(expr, end) for c, expr in q.get(_GOODPUT, {}).items()
                   if c is not None}
        if unread := [c for c, v in goodput.items() if math.isnan(v) and requests.get(c, 0) > 0]:
            # A class with an SLO served requests and its goodput read no series: read as
            # 0, every trial would score (and sloAttainment show) a config that met the
            # SLO as one that met none.
            raise WindowRejected(
                f"{', '.join(unread)} finished requests but its goodput reads no series: "
                "no verdicts (slopilot_slo_*) nor both latency histograms (" +
                f"{self.latency.ttft.engine.metric}, {self.latency.tbt.engine.metric}"
                ") for it; a vLLM image older than "
                "0.11 exports its token gaps under another name: use vLLM 0.11 or newer")
        return window_summary(
            requests=requests, refused=self._by_class(q["refused"][None], end),
            ttft_samples=self._by_class(q["ttft_samples"][None], end),
            awaiting=(self._by_class(q["awaiting"][None], end) if "awaiting" in q
                      else None),
            throughput=self._by_class(q["throughput"][None], end),
            ttft_p99_s=p99["ttft"], tbt_p99_s=p99["tbt"], goodput=goodput,
            preemptions_per_min=self._scalar(q[_PREEMPT][None], end),
            overall_ttft_p99_s=self._scalar(q["ttft_p99_all"][None], end),
            overall_tbt_p99_s=self._scalar(q["tbt_p99_all"][None], end),
            busy_ratio=self._scalar(q["busy_avg"][None], end),
            busy_ratio_max=self._scalar(q["busy_max"][None], end),
            duration_s=w, window=Window(start, end, canary), request_rate=rate)


class PrometheusProbe:
    """WorkloadProbe: the last ``window_s`` of traffic, as ``base``'s hardware under it.

    Too little traffic to profile (a quiet deployment) gives ``base`` itself, as the
    simulated twin does: the capacity search then plans for the designed load.
    ``latency``: the backend's TTFT source, as the trial windows read it
    (``PrometheusWindows``), for ``timed_rates``.
    """

    def __init__(self, query: QueryAt | str, selector: Mapping[str, str], base: Scenario, *,
                 window_s: int = 60, duration_s: float = 60.0, min_requests: int = 10,
                 latency: LatencySources = BUILTIN_LATENCY) -> None:
        check_probe(window_s, duration_s)
        self.query = query_at(query) if isinstance(query, str) else query
        self.selector = dict(selector)
        render_selector(self.selector)
        self.base, self.window_s, self.duration_s = base, window_s, duration_s
        self.min_requests = min_requests
        self.latency = latency

    def timed_rates(self, now: float) -> dict[str, float] | None:
        """``TimedRates``: the first tokens each class's TTFT P99 ranks over the window, a
        second, counted as a trial's window counts them (``latency_count``, its
        ``ttft_samples``): on vLLM the meter's streams wherever it timed one, which may be
        few of the requests that came. None on the built-in engine, whose own histograms
        time every request: there they are the arrivals. A class whose count reads what
        no counter gives (negative, not finite) is left out: its arrivals stand."""
        if self.latency.ttft.client is None:
            return None
        w, sel = duration(self.window_s), render_selector(self.selector)
        counted = {s["metric"].get("priority_class", ""): float(s["value"][1])
                   for s in self.query(latency_count(self.latency.ttft, sel, w), now)}
        return {c: n / self.window_s for c, n in counted.items()
                if math.isfinite(n) and n >= 0}

    def measure(self, now: float) -> Scenario:
        """Raises PrometheusUnavailable where the deployment's engines left no series in
        the window: that is no quiet deployment (whose engines export their gauges, idle
        or not) but metrics that stopped reaching Prometheus, and the designed load is
        no plan for it (a busy deployment was scaled down on it)."""
        def at_now(expr: str) -> list[dict[str, Any]]:
            return self.query(expr, now)

        w, sel = duration(self.window_s), render_selector(self.selector)
        if not at_now(f"count(last_over_time(vllm:num_requests_running{sel}[{w}]))"):
            raise PrometheusUnavailable(
                f"no series of the deployment's engines in the last {w} (Prometheus "
                f"answers, but nothing matches {sel}): the scrape is failing or its "
                "relabelling changed; no scale is planned on no evidence")
        return profiled_or_base(lambda: WorkloadProfile.measure(
            at_now, self.selector, self.window_s, min_requests=self.min_requests, now=now),
            self.base, self.duration_s)
