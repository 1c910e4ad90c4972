"""Score a config on live engines: apply it, wait a window, read PromQL back.

The queries are the ones the deployment's recording rules use (rendered here from the
same SLO with the window as the rate range), so the tuner measures exactly what the
alerts watch. A window with too few finished requests, or whose request rate moved
more than ``load_tolerance`` from the window before the change, raises
``WindowRejected``: the caller repeats it and does not count it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.query import query_at, window_summary
from slopilot.tuner.prometheus.rules import (
    RuleOptions,
    duration,
    render_rule_groups,
    render_selector,
)
from slopilot.tuner.study.evaluator import WindowRejected
from slopilot.tuner.study.objective import TrialResult, score

_QUANTILES = {"ttft_p99_ms": "slopilot:ttft_seconds:p99", "tbt_p99_ms": "slopilot:tbt_seconds:p99"}
_GOODPUT = "slopilot:goodput_tokens:per_second"
_PREEMPT = "slopilot:preemptions:per_minute"


class PrometheusEvaluator:
    """Evaluates configs on the engines ``selector`` picks out in Prometheus.

    ``apply_config`` pushes a validated config to the engines (the demo and operator
    PUT /admin/config on each pod). ``base`` is the engines' current config: a config
    is checked against it (live knobs only) before anything is applied.
    """

    def __init__(self, prometheus_url: str, apply_config: Callable[[Mapping[str, Any]], None],
                 *, slo: SLOSpec, selector: Mapping[str, str], window_s: int,
                 min_requests: int, load_tolerance: float = 0.25, settle_s: float = 0.0,
                 base: EngineConfig | None = None, timeout_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(prometheus_url, str) or not prometheus_url.startswith(
                ("http://", "https://")):
            raise ValueError(f"prometheus_url={prometheus_url!r}: expected an http(s) URL, "
                             "e.g. http://prometheus-operated.monitoring:9090")
        if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s < 1:
            raise ValueError(f"window_s={window_s!r}: expected whole seconds >= 1 "
                             "(at least two scrape intervals)")
        if isinstance(min_requests, bool) or not isinstance(min_requests, int) \
                or min_requests < 1:
            raise ValueError(f"min_requests={min_requests!r}: expected a count >= 1")
        if not load_tolerance > 0:
            raise ValueError(f"load_tolerance={load_tolerance!r}: expected a ratio > 0, "
                             "e.g. 0.25 for a 25 % change in request rate")
        if settle_s < 0:
            raise ValueError(f"settle_s={settle_s!r}: expected seconds >= 0")
        if not selector:
            raise ValueError("selector is empty: it would mix every engine in Prometheus; "
                             "pass the deployment's labels, e.g. {'slopilot_deployment': 'x'}")
        self.url = prometheus_url.rstrip("/")
        self.apply_config = apply_config
        self._slo = slo
        self.selector = dict(selector)
        self.window_s = window_s
        self.min_requests = min_requests
        self.load_tolerance = load_tolerance
        self.settle_s = settle_s
        self.base = base or EngineConfig()
        self._sleep = sleep
        self._clock = clock
        self._run = query_at(self.url, timeout_s)
        self._queries = self._build_queries()
        self.last_request_rate: float | None = None

    @property
    def slo(self) -> SLOSpec:
        return self._slo

    def _build_queries(self) -> dict[str, dict[str | None, str]]:
        """Record name -> {priority_class or None: expr}, from the rendered rules."""
        groups = render_rule_groups(self._slo, "tuner", selector=self.selector,
                                    options=RuleOptions(rate_window_s=self.window_s))
        out: dict[str, dict[str | None, str]] = {}
        for rule in groups["groups"][0]["rules"]:
            if "record" in rule:
                cls = rule["labels"].get("priority_class")
                out.setdefault(rule["record"], {})[cls] = rule["expr"]
        w, sel = duration(self.window_s), render_selector(self.selector)
        out["requests"] = {None: f"sum by (priority_class) (increase("
                                 f"vllm:e2e_request_latency_seconds_count{sel}[{w}]))"}
        # Arrivals, not completions: a bad config slows completions, and that must read
        # as a bad trial, not as a load shift. Arrivals = finished + growth of the queue.
        out["request_rate"] = {None: (
            f"sum(rate(vllm:e2e_request_latency_seconds_count{sel}[{w}])) + "
            f"((sum(delta(vllm:num_requests_running{sel}[{w}])) + "
            f"sum(delta(vllm:num_requests_waiting{sel}[{w}]))) / {self.window_s}"
            " or vector(0))")}
        out["throughput"] = {None: f"sum by (priority_class) (rate("
                                   f"vllm:request_generation_tokens_sum{sel}[{w}]))"}
        return out

    # ------------------------------------------------------------------ queries
    def _query(self, expr: str) -> list[dict[str, Any]]:
        return self._run(expr, None)

    def _by_class(self, expr: str) -> dict[str, float]:
        out = {}
        for sample in self._query(expr):
            out[sample["metric"].get("priority_class", "")] = float(sample["value"][1])
        return out

    def _scalar(self, expr: str) -> float:
        result = self._query(expr)
        return float(result[0]["value"][1]) if result else math.nan

    def request_rate(self) -> float:
        """Arriving requests per second over the last window (NaN with no data)."""
        return self._scalar(self._queries["request_rate"][None])

    def measure(self) -> dict[str, Any]:
        """The last window as a DESIGN §8 style summary (what ``score`` reads)."""
        q = self._queries
        requests = self._by_class(q["requests"][None])
        throughput = self._by_class(q["throughput"][None])
        quantiles = {key: self._by_class(q[rec][None]) for key, rec in _QUANTILES.items()}
        goodput = {p.label: self._scalar(q[_GOODPUT][p.label]) for p in Priority
                   if p.label in q.get(_GOODPUT, {})}
        summary = window_summary(
            requests=requests, throughput=throughput, ttft_p99_s=quantiles["ttft_p99_ms"],
            tbt_p99_s=quantiles["tbt_p99_ms"], goodput=goodput,
            preemptions_per_min=self._scalar(q[_PREEMPT][None]), duration_s=self.window_s)
        summary["request_rate"] = self.request_rate()
        return summary

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        # Validate before touching anything: the engines only ever see whole, valid configs.
        self.base.with_overrides(config, live_only=True)
        before = self.request_rate()  # also proves Prometheus answers before we change a pod
        self.apply_config(dict(config))
        applied_at = self._clock()
        self._sleep(self.settle_s + self.window_s)
        summary = self.measure()
        summary["elapsed_s"] = self._clock() - applied_at
        rate = summary["request_rate"]
        self.last_request_rate = rate
        finished = summary["requests_finished"]
        if not finished >= self.min_requests:
            raise WindowRejected(
                f"only {finished:g} requests finished in the {self.window_s} s window; "
                f"need {self.min_requests} (lengthen window_s or lower min_requests)",
                config=config)
        if math.isfinite(before) and before > 0 and \
                abs(rate / before - 1.0) > self.load_tolerance:
            raise WindowRejected(
                f"request rate moved from {before:.3g}/s to {rate:.3g}/s (more than "
                f"{self.load_tolerance:.0%}): the window is not comparable", config=config)
        return score(summary, self._slo, config=dict(config))

