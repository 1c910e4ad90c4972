"""The live workload, measured from Prometheus, as a scenario the offline study can run.

From one window of the engines' metrics: the arrival rate (where the meter in front of a
vLLM engine counts its arrivals, that count less the requests its engine refused as
invalid; elsewhere finished requests per second plus the growth of the queue and those
turned away for load), the prompt and output length
distributions (the ``vllm:request_prompt_tokens`` / ``vllm:request_generation_tokens``
histograms: the mean from ``_sum / _count``, the lognormal spread most likely to have
filled the buckets, on the engine's power-of-two edges as on vLLM's 1-2-5; the prompts'
mean, where enough requests started in the window, theirs: ``_started_prompts``) and
the class mix (the arrivals per ``priority_class``, counted or estimated as the rate)
and how bursty the arrivals came (``burstiness.py``: the raw samples of an arrivals
counter, the meter's ``slopilot_meter_arrivals_total`` or the built-in engine's
``slopilot_requests_arrived_total``, binned: gamma arrivals at the cv they read; where no
replica exports one, or too few bins, the base scenario's process, said in the profile).
``to_scenario`` puts that workload, open loop, on a base scenario's hardware, model, knobs
and SLO.

One function (``WorkloadProfile.from_increases``) turns what the series grew by over the
window (``WorkloadIncreases``) into the profile, and checks it for figures no engine
exports; the increases come from PromQL (``WorkloadProfile.measure``) or, where the demo
runs without Prometheus, from two scrapes of the replicas (``local/scrape.DirectScrape``).
The queries go through ``PrometheusQuery`` (a callable: PromQL in, the API's result list
out), so recorded answers can stand in for a live server in tests and replays.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from slopilot.engine.meter.exposition import ARRIVALS, INVALID
from slopilot.engine.metric_names import ARRIVED, REFUSED
from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario, parse_scenario
from slopilot.engine.sim.spec_reader import ScenarioError
from slopilot.tuner.prometheus.burstiness import (
    BURST_WINDOW_S,
    Burstiness,
    Samples,
    arrival_process,
    arrivals_spec,
    base_arrivals,
    counter_bins,
    unmeasured,
)
from slopilot.tuner.prometheus.query import CHECK_METRICS, query_at
from slopilot.tuner.prometheus.rules import REPLICA_LABEL, duration, render_selector
from slopilot.tuner.prometheus.tls import VERIFIED, TLSVerify
from slopilot.tuner.study.evaluator import PrometheusUnavailable

PrometheusQuery = Callable[[str], list[dict[str, Any]]]
MAX_TWIN_REQUESTS = 1_000_000
"""The most requests a measured workload may bring to one simulation. The simulator's
processes are every deployment's: a pod that exports a queue grown by 1e12 (no engine
holds one) would have them simulate 2e10 requests a second until their time limit."""
PROMPT_TOKENS = "vllm:request_prompt_tokens"
OUTPUT_TOKENS = "vllm:request_generation_tokens"
PREFILLED = "vllm:prompt_tokens_total"
"""Prompt tokens counted where each request's prefill is done (vLLM's, the engine's)."""
FIRST_TOKENS = "vllm:time_to_first_token_seconds_count"
log = logging.getLogger(__name__)


class ProfileError(ValueError):
    """The window holds too little to profile; the message says what was missing."""


class ImplausibleWorkload(ProfileError):
    """The window's series hold what no engine exports (a broken or hostile image)."""


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """A token-length distribution as a lognormal (arithmetic mean, log-space sigma)."""

    mean: float
    sigma: float
    lo: float
    hi: float

    def to_spec(self) -> dict[str, Any]:
        return {"dist": "lognormal", "mean": round(self.mean, 3),
                "sigma": round(min(self.sigma, 5.0), 4), "min": self.lo, "max": self.hi}


def length_profile(buckets: Mapping[float, float], total: float, count: float) -> LengthProfile:
    """Fit from cumulative bucket counts ``{le: count}`` (``inf`` included), sum and count."""
    if not count > 0:
        raise ProfileError("no finished requests in the window: nothing to profile")
    edges = sorted(buckets)
    mean = total / count
    prev_edge, prev_cum = 0.0, 0.0
    mass: list[tuple[float, float, float]] = []  # (lower, upper, requests)
    for edge in edges:
        n = buckets[edge] - prev_cum
        if n > 0:
            mass.append((prev_edge, edge, n))
        prev_edge, prev_cum = edge, buckets[edge]
    finite = [(lo, hi, n) for lo, hi, n in mass if math.isfinite(hi)]
    if not finite:
        return LengthProfile(mean, 0.0, mean, mean)
    sigma = 0.0 if len(mass) == 1 or not mean > 0 else _binned_sigma(mass, mean)
    lo = max(1.0, finite[0][0])
    hi = finite[-1][1] if len(finite) == len(mass) else max(finite[-1][1], mean)
    return LengthProfile(mean=mean, sigma=sigma, lo=lo, hi=max(hi, math.ceil(mean)))


def _binned_sigma(mass: list[tuple[float, float, float]], mean: float) -> float:
    """The log-space sigma of the lognormal of arithmetic mean ``mean`` most likely to
    have put ``mass`` (``(lower, upper, requests)`` per bucket, the last one open) in its
    buckets. Read off bucket midpoints with Sheppard's correction instead, it held for
    the engine's power-of-two edges only: on vLLM's 1-2-5 edges (buckets ln 2.5 wide)
    a narrow spread read half or double what it was, and one of 0.2 read 0."""
    from scipy.optimize import minimize_scalar
    from scipy.special import ndtr

    with np.errstate(divide="ignore"):
        lo = np.log(np.array([m[0] for m in mass]))
        hi = np.log(np.array([m[1] for m in mass]))
    n = np.array([m[2] for m in mass])

    def nll(sigma: float) -> float:
        mu = math.log(mean) - sigma * sigma / 2
        p = ndtr((hi - mu) / sigma) - ndtr((lo - mu) / sigma)
        return -float(np.sum(n * np.log(np.maximum(p, 1e-300))))

    fit = minimize_scalar(nll, bounds=(1e-3, 5.0), method="bounded",
                          options={"xatol": 1e-4})
    return float(fit.x)


def _count(series: str, value: float) -> float:
    """One sample of a counter or histogram's increase: finite and never negative, as no
    engine's series give otherwise."""
    if not math.isfinite(value) or value < 0:
        raise ImplausibleWorkload(f"{series} read {value:g}, which no engine's series give: "
                           f"{CHECK_METRICS}")
    return value


def _check_window(window_s: int) -> None:
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s < 1:
        raise ValueError(f"window_s={window_s!r}: expected whole seconds >= 1")


@dataclass(frozen=True, slots=True)
class LengthIncreases:
    """One token-length histogram's increases over the window, every replica's summed."""

    buckets: Mapping[float, float]
    """Cumulative ``{le: requests}``, ``inf`` included."""
    total: float
    """Of ``_sum``: the tokens."""
    count: float
    """Of ``_count``: the requests."""


@dataclass(frozen=True, slots=True)
class CountedArrivals:
    """Where the meter in front of a vLLM engine counts its arrivals (``ARRIVALS``): each
    request its replica was asked for, counted as it came. vLLM drops a request whose
    client gave up (a disconnect, a client's timeout) from every series it observes at
    the finish, and from its running and waiting gauges once aborted, so finished +
    refused + queue growth reads the load its clients gave up on as never offered: in
    the overload the loop acts on, the twin planned for less than came.

    The other fields are the replicas' that do not export the count (a pod of an image
    from before it, mid-rollout): their arrivals are estimated as without it. A replica
    that counts its arrivals counts those its engine turned away too: not again."""

    arrived: Mapping[str, float]
    """Requests counted at their arrival, by ``priority_class``, less those the engine
    refused as invalid (``INVALID``: a client's error, never served, however fast a
    client retries it), each replica's off its own and none below 0
    (``counted_arrivals``)."""
    others_finished: Mapping[str, float] = dataclasses.field(default_factory=dict)
    others_refused: Mapping[str, float] = dataclasses.field(default_factory=dict)
    others_queue_growth: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkloadIncreases:
    """What the engines' series grew by over one window: all a profile is measured from.

    As read, unchecked: ``WorkloadProfile.from_increases`` rejects what no engine exports.
    """

    finished: Mapping[str, float]
    """Requests finished, by ``priority_class`` (the prompt histogram's ``_count``)."""
    refused: Mapping[str, float]
    """Requests turned away for load (``metric_names.REFUSED``), by ``priority_class``."""
    prompt: LengthIncreases
    output: LengthIncreases
    queue_growth: float
    """Running plus waiting requests at the window's end less at its start (a gauge's
    change: negative where the queue drained)."""
    started: float = 0.0
    """Requests whose first token came in the window (``FIRST_TOKENS``, every class)."""
    started_prompt: float = 0.0
    """Their prompts' tokens (``PREFILLED``'s increase)."""
    counted: CountedArrivals | None = None
    """The arrivals the meters counted, where any replica exports their count; None
    where none does (the built-in engine, a vLLM without the meter): the arrivals are
    then finished + refused + queue growth, every replica's."""
    burstiness: Burstiness | None = None
    """How bursty the arrivals came (``burstiness.counter_bins`` of an arrivals
    counter's raw samples); None where nothing was read."""


def unmetered(sel: str, w: str) -> str:
    """What a vector of the deployment's series (``sel``, over ``w``) keeps of its
    replicas that do not export the meter's arrival count, put after it: their arrivals
    are estimated, the others' counted (``ARRIVALS``). A meter of the window, whatever its
    traffic, exported the count (at 0 from its start)."""
    return f" unless on ({REPLICA_LABEL}) last_over_time({ARRIVALS}{sel}[{w}])"


def counted_arrivals(sel: str, w: str, fn: str = "increase") -> str:
    """The metered replicas' arrivals over ``w`` (``fn``: ``increase`` or ``rate``), by
    replica and ``priority_class``: each one's count (``ARRIVALS``) less the requests its
    engine refused as invalid (``INVALID``), not below 0 (one that came before the window
    and was refused inside it); whole where a meter counts none (an image from before)."""
    by = f"sum by ({REPLICA_LABEL}, priority_class)"
    arrived = f"{by} ({fn}({ARRIVALS}{sel}[{w}]))"
    return f"(clamp_min({arrived} - {by} ({fn}({INVALID}{sel}[{w}])), 0) or {arrived})"


def raw_arrivals(query: PrometheusQuery, selector: Mapping[str, str], window_s: int,
                 now: float | None = None) -> Burstiness:
    """The burstiness of the arrivals over the last ``window_s`` (at least
    ``BURST_WINDOW_S``) before ``now`` (else the newest sample), from the raw samples of
    each replica's arrivals counter: an instant query of a range vector returns them as
    scraped. The meter's count in front of vLLM, else the built-in engine's own; a
    replica with neither (vLLM without the meter) is in no bin, and none with either is
    no verdict. Never a subquery: it resamples on Prometheus' grid, and read a steady
    load's scrape jitter as bursts."""
    sel = render_selector(selector)
    w = duration(max(window_s, int(BURST_WINDOW_S)))
    try:
        metered = _raw(query(f"{ARRIVALS}{sel}[{w}]"))
        engines = _raw(query(f"{ARRIVED}{sel}[{w}]"))
        invalid = _raw(query(f"{INVALID}{sel}[{w}]")) if metered else []
    except PrometheusUnavailable as exc:
        # Past the answer's bound (hundreds of replicas scraped every second): the rest
        # of the profile stands, read already; the arrivals are planned as designed.
        return unmeasured(f"the arrivals counter's raw samples were not read: {exc}")
    have = {r for r, _ in metered}
    series = [s for _, s in metered] + [s for r, s in engines if r not in have]
    if not series:
        return unmeasured(f"no replica exports an arrivals counter ({ARRIVALS} or "
                          f"{ARRIVED})")
    end = now if now is not None else max(s[-1][0] for s in series if s)
    # The meter's count takes in the requests its engine refused as invalid (a client's
    # 400s, sent in a burst by one client): no load, as counted_arrivals takes them off.
    return counter_bins(series, end - max(window_s, BURST_WINDOW_S), end,
                        minus=[s for r, s in invalid if r in have])


def _raw(result: list[dict[str, Any]]) -> list[tuple[str, Samples]]:
    """A range vector's series as ``(replica, [(time, value), ...])``, the finite ones;
    an answer without samples (an instant vector) is none."""
    out: list[tuple[str, Samples]] = []
    for r in result:
        values = r.get("values")
        if not isinstance(values, list):
            continue
        samples = [(float(t), float(v)) for t, v in values]
        if all(math.isfinite(t) and math.isfinite(v) for t, v in samples):
            out.append((str(r.get("metric", {}).get(REPLICA_LABEL, "")), samples))
    return out


def prometheus_increases(query: PrometheusQuery, selector: Mapping[str, str],
                         window_s: int, *, now: float | None = None) -> WorkloadIncreases:
    """The increases over the last ``window_s`` seconds of the engines ``selector`` picks
    (``now``: the instant the query reads at, for the arrivals' bins)."""
    _check_window(window_s)
    sel, w = render_selector(selector), duration(window_s)

    def inc(expr: str, by: str = "", unless: str = "") -> list[dict[str, Any]]:
        group = f" by ({by})" if by else ""
        return query(f"sum{group} (increase({expr}{sel}[{w}]){unless})")

    def classes(result: list[dict[str, Any]]) -> dict[str, float]:
        return {s["metric"].get("priority_class", ""): float(s["value"][1]) for s in result}

    def by_class(expr: str, unless: str = "") -> dict[str, float]:
        return classes(inc(expr, "priority_class", unless))

    def length(name: str) -> LengthIncreases:
        # One series each (``sum`` without ``by``), or none: nothing finished.
        return LengthIncreases(
            buckets={float(s["metric"]["le"]): float(s["value"][1])
                     for s in inc(f"{name}_bucket", "le")},
            total=sum(float(s["value"][1]) for s in inc(f"{name}_sum")),
            count=sum(float(s["value"][1]) for s in inc(f"{name}_count")))

    def total(expr: str) -> float:
        return sum(float(s["value"][1]) for s in inc(expr))

    def growth(unless: str = "") -> float:
        running = query(f"sum(delta(vllm:num_requests_running{sel}[{w}]){unless}) + "
                        f"sum(delta(vllm:num_requests_waiting{sel}[{w}]){unless})")
        return float(running[0]["value"][1]) if running else 0.0

    counted = None
    if arrived := classes(query(f"sum by (priority_class) {counted_arrivals(sel, w)}")):
        # The replicas without the count, by the target Prometheus scraped: a meter of
        # the window, whatever its traffic, exported it (at 0 from its start).
        others = unmetered(sel, w)
        counted = CountedArrivals(
            arrived=arrived, others_finished=by_class(f"{PROMPT_TOKENS}_count", others),
            others_refused=by_class(REFUSED, others), others_queue_growth=growth(others))
    return WorkloadIncreases(
        finished=by_class(f"{PROMPT_TOKENS}_count"), refused=by_class(REFUSED),
        prompt=length(PROMPT_TOKENS), output=length(OUTPUT_TOKENS),
        queue_growth=growth(), started=total(FIRST_TOKENS),
        started_prompt=total(PREFILLED), counted=counted,
        burstiness=raw_arrivals(query, selector, window_s, now))


def _length(name: str, inc: LengthIncreases) -> LengthProfile:
    buckets = {le: _count(f"{name}_bucket{{le={le:g}}}", n) for le, n in inc.buckets.items()}
    return length_profile(buckets, _count(f"{name}_sum", inc.total),
                          _count(f"{name}_count", inc.count))


def _started_prompts(finished: LengthProfile, inc: WorkloadIncreases,
                     min_requests: int) -> LengthProfile:
    """The prompts of the requests that started in the window, where ``min_requests`` of
    them did: their mean from the prompt counter, the spread the finished ones' (no
    histogram is observed at the start), scaled to it. Both histograms of lengths are
    observed at the finish, in vLLM as here: right after a shift to long prompts, the
    requests that ended in the window were mostly the old, short ones."""
    started = _count(FIRST_TOKENS, inc.started)
    tokens = _count(PREFILLED, inc.started_prompt)
    if started < max(1, min_requests) or not tokens > 0 or not finished.mean > 0:
        return finished
    mean = tokens / started
    scale = mean / finished.mean
    return LengthProfile(mean=mean, sigma=finished.sigma, lo=max(1.0, finished.lo * scale),
                         hi=max(finished.hi * scale, math.ceil(mean)))


def _offered(inc: WorkloadIncreases, finished: Mapping[str, float]
             ) -> tuple[dict[str, float], float]:
    """The requests offered in the window by ``priority_class``, and the queue's growth
    that adds to them: counted where the meters count them (``CountedArrivals``), else
    ``finished`` (checked) + turned away for load, plus the growth of the queue."""
    def estimated(finished: Mapping[str, float], refused: Mapping[str, float],
                  growth: float) -> tuple[dict[str, float], float]:
        if math.isinf(growth):
            raise ImplausibleWorkload(f"the queue's growth read {growth:g}, which no "
                                      f"engine's series give: {CHECK_METRICS}")
        # Turned away for load (429): offered, if not let in. Planned for without them,
        # a saturated deployment's load was its own throughput, and no plan grew it. A
        # retry turned away is not counted again (metric_names.RETRIES); one let in
        # counts as served: a call turned away once and then served is planned for twice.
        offered = dict(finished)
        for c, n in refused.items():
            offered[c] = offered.get(c, 0.0) + _count(f"{REFUSED}{{priority_class={c}}}", n)
        return offered, growth if math.isfinite(growth) else 0.0

    counted = inc.counted
    if counted is None:
        return estimated(finished, inc.refused, inc.queue_growth)
    others, growth = estimated(
        {c: _count(f"{PROMPT_TOKENS}_count{{priority_class={c}}}", n)
         for c, n in counted.others_finished.items()},
        counted.others_refused, counted.others_queue_growth)
    for c, n in counted.arrived.items():
        others[c] = others.get(c, 0.0) + _count(f"{ARRIVALS}{{priority_class={c}}}", n)
    return others, growth


@dataclass(frozen=True)
class WorkloadProfile:
    arrival_rate: float
    """Requests per second."""
    prompt: LengthProfile
    output: LengthProfile
    class_mix: Mapping[str, float]
    """Fractions of requests per class (p0, p1, p2), summing to 1."""
    window_s: int
    requests: float
    burstiness: Burstiness | None = None
    """How bursty the arrivals came; None or no cv: not measured (the base's process)."""

    @classmethod
    def measure(cls, query: PrometheusQuery, selector: Mapping[str, str], window_s: int,
                *, min_requests: int = 20, now: float | None = None) -> WorkloadProfile:
        """Profile the last ``window_s`` seconds of the engines ``selector`` picks."""
        return cls.from_increases(prometheus_increases(query, selector, window_s, now=now),
                                  window_s, min_requests=min_requests)

    @classmethod
    def from_increases(cls, inc: WorkloadIncreases, window_s: int, *,
                       min_requests: int = 20) -> WorkloadProfile:
        """Profile a window of ``window_s`` seconds from what its series grew by."""
        _check_window(window_s)
        per_class = {c: _count(f"{PROMPT_TOKENS}_count{{priority_class={c}}}", n)
                     for c, n in inc.finished.items()}
        requests = sum(per_class.values())
        if requests < min_requests:
            raise ProfileError(f"only {requests:g} requests finished in the last "
                               f"{duration(window_s)}; need {min_requests} to profile "
                               "(widen the window)")
        prompt = _started_prompts(_length(PROMPT_TOKENS, inc.prompt), inc, min_requests)
        output = _length(OUTPUT_TOKENS, inc.output)
        by_class, growth = _offered(inc, per_class)
        offered = sum(by_class.values())
        rate = max(0.0, (offered + growth) / window_s)
        # No arrival counted in the window (the load stopped): the rate reads 0, and the
        # mix is the finished requests'.
        shares = by_class if offered > 0 else per_class
        total = sum(shares.values()) or 1.0
        mix = {p.label: shares.get(p.label, 0.0) / total for p in Priority}
        return cls(arrival_rate=rate, prompt=prompt, output=output,
                   class_mix=mix, window_s=window_s, requests=requests,
                   burstiness=inc.burstiness)

    @classmethod
    def from_prometheus(cls, url: str, selector: Mapping[str, str], window_s: int, *,
                        min_requests: int = 20, timeout_s: float = 10.0,
                        verify: TLSVerify = VERIFIED) -> WorkloadProfile:
        # One instant for every series: each query at Prometheus' "now" let a scrape land
        # between the lengths' _sum and _count (a mean output of 10.8 for 12 asked).
        at = time.time()
        query = prometheus_query(url, timeout_s, verify=verify, at=at)
        return cls.measure(query, selector, window_s, min_requests=min_requests, now=at)

    def workload_spec(self, *, shared_prefix_tokens: int = 0,
                      base: Scenario | None = None) -> dict[str, Any]:
        """The open-loop workload section of a scenario file: arrivals at the measured
        rate, gamma where they came bursty (``burstiness.arrival_process``), ``base``'s
        process where that was not measured."""
        mix = {k: round(v, 4) for k, v in self.class_mix.items() if v > 0}
        process = arrival_process(self.arrival_rate, self.burstiness,
                                  base_arrivals(base) if base is not None else None)
        return {"type": "open_loop", "arrivals": arrivals_spec(process),
                "prompt_tokens": self.prompt.to_spec(), "output_tokens": self.output.to_spec(),
                "shared_prefix_tokens": shared_prefix_tokens, "classes": mix}

    def to_scenario(self, base: Scenario, *, duration_s: float | None = None,
                    shared_prefix_tokens: int = 0, name: str | None = None) -> Scenario:
        """``base``'s hardware, model, knobs, SLO and dispatch under this measured workload."""
        if not self.arrival_rate > 0:
            raise ProfileError("the measured arrival rate is zero: no workload to simulate")
        data: dict[str, Any] = {
            "name": name or f"{base.name}-live",
            "description": (f"{base.name} hardware under the workload measured over "
                            f"{self.window_s} s: {self.arrival_rate:.3g} req/s ("
                            f"{(self.burstiness or unmeasured('not read')).describe()}), "
                            f"prompts ~{self.prompt.mean:.0f} tok, outputs "
                            f"~{self.output.mean:.0f} tok"),
            "gpu": base.gpu, "num_gpus": base.num_gpus, "tp": base.tp, "model": base.model,
            "duration_s": duration_s if duration_s is not None else base.duration_s,
            "seed": base.seed, "engine": dict(base.engine), "slo": base.slo.to_dict(),
            "dispatch": base.dispatch.value,  # behind the same load balancer
            "workload": self.workload_spec(shared_prefix_tokens=shared_prefix_tokens,
                                           base=base),
        }
        if base.gpu_memory_utilization is not None:
            data["gpu_memory_utilization"] = base.gpu_memory_utilization
        if (many := self.arrival_rate * data["duration_s"]) > MAX_TWIN_REQUESTS:
            raise ImplausibleWorkload(
                f"the measured arrival rate, {self.arrival_rate:.3g} requests a second, "
                f"would be {many:.3g} requests in the twin's {data['duration_s']:g} s (at "
                f"most {MAX_TWIN_REQUESTS:,}): {CHECK_METRICS}")
        try:
            measured = parse_scenario(data, source=f"profile of {base.name}")
        except ScenarioError as exc:
            raise ImplausibleWorkload(f"the measured workload is no scenario ({exc}): "
                               f"{CHECK_METRICS}") from None
        # The twin keeps the base's calibrated cost profile, if it has one.
        return dataclasses.replace(measured, profile=base.profile)


def prometheus_query(url: str, timeout_s: float = 10.0, *, verify: TLSVerify = VERIFIED,
                     at: float | None = None) -> PrometheusQuery:
    """A ``PrometheusQuery``: instant queries at ``at`` (Unix seconds), else each at the
    server's now; unreachable -> PrometheusUnavailable."""
    run = query_at(url, timeout_s, verify=verify)
    return lambda expr: run(expr, at)


def probe_window_s(window_s: float) -> int:
    """The probe's window for a controller whose windows last ``window_s``: the same
    whole seconds that PromQL's range reads of each of them (``adapters.range_s``), so
    that the twin check simulates the workload of the window it is held against (on a
    longer one, right after a shift, mostly the old prompts)."""
    return max(2, int(window_s))


def check_probe(window_s: int, duration_s: float) -> None:
    """A probe's settings: a window of whole seconds, at least two (a rate over 1 s
    scrapes), and a simulation of some length."""
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s < 2:
        raise ValueError(f"window_s={window_s!r}: expected whole seconds >= 2")
    if not duration_s > 0:
        raise ValueError(f"duration_s={duration_s!r}: expected simulated seconds > 0")


def profiled_or_base(profile: Callable[[], WorkloadProfile], base: Scenario,
                     duration_s: float) -> Scenario:
    """The probes' answer: ``profile()``'s workload on ``base``'s hardware, or ``base``
    itself where the window holds too little to profile (a quiet deployment: the capacity
    search then plans for the designed load) or what no engine exports (logged)."""
    try:
        return profile().to_scenario(base, duration_s=duration_s)
    except ImplausibleWorkload as exc:
        log.warning("the live workload is not profiled; the twin plans for the base "
                    "scenario: %s", exc)
        return base
    except ProfileError:
        return base
