"""``WindowSummary``: what one source measured over one window, the tuner's one currency.

Each source builds it in one place: the simulator (``engine/sim/stats.py``), the
simulated cluster (``engine/sim/cluster.py``), Prometheus (``tuner/prometheus/query.py``)
and the demo's direct scrape (``tuner/local/scrape.py``, through the same builder). The
objective, the alert conditions, the capacity search and the controller read it.

It lives in the engine, beside ``slo.py``, because the simulator produces it and the
engine imports nothing from the tuner; and not under ``engine/sim/``, because the live
sources, which simulate nothing, build it as well.

Empty statistics are ``None``, never NaN or 0: a class that served nothing in a window
has no P99 (nor mean, nor SLO attainment). None, because the summary crosses JSON twice,
in ``slopilot simulate --json`` and in Optuna's user attributes, where NaN is not valid
JSON (``jq`` and most parsers refuse it) and 0 would read as a perfect latency; and
because ``float | None`` makes the type checker ask every reader what an empty window
means, where a NaN silently compares False. The builders turn Prometheus' NaN into None
(``or_none``); the constructors refuse NaN anywhere.

``to_dict`` is the JSON form: the overall figures at the top level and each class under
``classes`` (``p0``, ``p1``, ``p2``) with the same keys plus the engine-wide
``preemptions_per_min``; the optional groups below add their keys only when the source
measured them (a simulator run writes the keys ``slopilot simulate --json`` always had,
plus the request accounting and ``busy_ratio_max`` it added). ``from_dict`` reads that
back, and the dicts earlier versions stored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.request import Priority


class SummaryError(ValueError):
    """A summary (or its dict form) lacks a figure or holds a bad one; names which."""


def or_none(value: float | None) -> float | None:
    """A statistic as the summary keeps it: NaN (Prometheus' "no samples") is None."""
    return None if value is None or math.isnan(value) else float(value)


def _check(kind: str, values: Mapping[str, Any], optional: tuple[str, ...] = ()) -> None:
    for name, value in values.items():
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            what = "a finite number or None" if name in optional else "a finite number"
            raise SummaryError(f"{kind}.{name}={value!r}: expected {what}")


def _numbers(owner: Any) -> dict[str, Any]:
    return {f.name: getattr(owner, f.name) for f in dataclasses.fields(owner)
            if f.name not in ("samples", "accounting", "canary", "bucketed")}


@dataclass(frozen=True, slots=True)
class SampleStats:
    """What only exact per-token samples give (the simulator), beside the P99s."""

    ttft_mean_ms: float | None
    """Of the TTFTs measured (censored ones included), not of the requests refused for
    load: they have no first token to average, where the percentiles rank them."""
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tbt_p50_ms: float | None
    max_stall_ms: float
    """The longest token gap; 0 when there was none."""
    ttft_measured_pct: float | None = None
    """The percent of the requests the TTFT percentiles rank whose TTFT was measured (a
    first token, or a censored wait); the rest were refused for load and ranked past
    them. A TTFT percentile above it (``ttft_p99_ms`` with this under 99) falls among
    the refused and reads ``sim.stats.REFUSED_TTFT_S`` (300,000 ms): a floor, not a time
    measured. 100 with none refused; None with nothing ranked (and in summaries from
    before it was written)."""

    def __post_init__(self) -> None:
        _check("SampleStats", _numbers(self),
               ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "tbt_p50_ms",
                "ttft_measured_pct"))


@dataclass(frozen=True, slots=True)
class RequestAccounting:
    """Where every request that arrived in the window went (the simulator knows each)."""

    requests_arrived: int
    requests_rejected: int
    """Refused at arrival: a prompt that can never fit, or a full waiting queue."""
    requests_unfinished: int
    """Admitted but not finished when the run ended (followed until then)."""
    ttft_censored: int
    """Of those, the ones without a first token: each enters the TTFT percentiles with the
    time it had waited when the run ended (a lower bound), not left out, so an overload
    that leaves requests waiting cannot read as a low P99."""
    offered_tok_s: float
    """Output tokens the window's requests asked for, per second of the window."""
    goodput_all_tok_s: float
    """Prompt and output tokens of the requests that met their SLO, per second."""

    def __post_init__(self) -> None:
        _check("RequestAccounting", _numbers(self))


@dataclass(frozen=True, slots=True)
class ClassFigures:
    """One priority class over the window (or every class together: ``overall``)."""

    requests_finished: float
    """A count; fractional from Prometheus, whose ``increase()`` extrapolates."""
    throughput_tok_s: float
    goodput_tok_s: float
    """Output tokens per second of the requests that met their class's SLO."""
    ttft_p99_ms: float | None
    tbt_p99_ms: float | None
    slo_attainment: float | None = None
    """Share of the requests judged (finished, or turned away for load) that met the SLO;
    None with none judged, and from Prometheus, which cannot tell per request."""
    requests_refused: float = 0.0
    """Requests turned away for load in the window (429: the waiting queue was full),
    never served: a count, fractional from Prometheus as ``requests_finished``."""
    samples: SampleStats | None = None
    accounting: RequestAccounting | None = None
    ttft_samples: float | None = None
    """The observations ``ttft_p99_ms`` ranks (first tokens, and those never given): the
    count a P99 rests on, which a floor of requests must read (``sample_floor``). Not
    ``requests_finished`` where the P99 is read from another histogram: on vLLM the
    meter's, of streamed requests only. None where a source does not say (and in
    summaries from before it was counted): then ``requests_finished``."""
    requests_awaiting: float | None = None
    """Requests given no first token yet at the window's end, within their TTFT target or
    past it: the simulator's censored TTFTs (``RequestAccounting.ttft_censored``), a live
    engine's or meter's gauge as it stands then (``engine/awaiting.py``). Those past the
    target are in ``ttft_samples`` and ranked by ``ttft_p99_ms`` as misses; any at all
    say the class was sent traffic, so that a class short of samples with clients
    waiting is never read as unmeasured or sparse (``sample_floor.starved``). None where
    a source does not say (a meter's bodies, an image from before the gauge)."""

    def __post_init__(self) -> None:
        if self.samples is not None and not isinstance(self.samples, SampleStats):
            raise SummaryError(f"ClassFigures.samples={self.samples!r}: expected SampleStats")
        if self.accounting is not None and not isinstance(self.accounting, RequestAccounting):
            raise SummaryError(f"ClassFigures.accounting={self.accounting!r}: expected "
                               "RequestAccounting")
        _check("ClassFigures", _numbers(self),
               ("ttft_p99_ms", "tbt_p99_ms", "slo_attainment", "ttft_samples",
                "requests_awaiting"))
        for name in ("requests_refused", "ttft_samples", "requests_awaiting"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SummaryError(f"ClassFigures.{name}={value!r}: expected a count >= 0")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests_finished": self.requests_finished, "slo_attainment": self.slo_attainment,
            "requests_refused": self.requests_refused,
            "ttft_p99_ms": self.ttft_p99_ms, "tbt_p99_ms": self.tbt_p99_ms,
            "throughput_tok_s": self.throughput_tok_s, "goodput_tok_s": self.goodput_tok_s}
        if self.ttft_samples is not None:
            out["ttft_samples"] = self.ttft_samples
        if self.requests_awaiting is not None:
            out["requests_awaiting"] = self.requests_awaiting
        for group in (self.samples, self.accounting):
            if group is not None:
                out.update(dataclasses.asdict(group))
        return out


@dataclass(frozen=True, slots=True)
class Window:
    """Where a measured window lies on its source's clock, and whose replicas it covers."""

    start: float
    end: float
    canary: bool = False
    bucketed: bool = False
    """Its P99s were read from the latency histograms (``histogram_quantile`` over the
    engine's buckets), not from every sample: a prediction compared with them is read
    the same way (``histogram_quantiles.latency_quantile``)."""

    def __post_init__(self) -> None:
        _check("Window", _numbers(self))
        for name in ("canary", "bucketed"):
            if not isinstance(getattr(self, name), bool):
                raise SummaryError(f"Window.{name}={getattr(self, name)!r}: expected true "
                                   "or false")


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the simulator sees inside its engines (no live window reports these)."""

    iterations: int
    mean_batch_tokens: float
    kv_usage_mean: float
    kv_usage_max: float
    preemptions_per_min_recompute: float
    preemptions_per_min_swap: float

    def __post_init__(self) -> None:
        _check("EngineStats", _numbers(self))


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a whole simulated run was: its scenario, its knobs, what it turned away."""

    scenario: str
    config: Mapping[str, Any]
    """The full engine config (``EngineConfig.to_dict``)."""
    rejected: int
    prefix_hit_rate: float
    twin: str = ""
    """Which cost model ran (``sim.twin.twin_label``); empty in studies from before it."""
    calibrated: bool = False
    """Whether that cost model was a measured profile rather than the datasheet roofline."""

    def __post_init__(self) -> None:
        if not isinstance(self.scenario, str) or not isinstance(self.config, Mapping):
            raise SummaryError(f"RunInfo: scenario={self.scenario!r} and config: expected a "
                               "name and a mapping of knobs")
        if not isinstance(self.twin, str) or not isinstance(self.calibrated, bool):
            raise SummaryError(f"RunInfo: twin={self.twin!r}, calibrated={self.calibrated!r}: "
                               "expected a label and true or false")
        _check("RunInfo", {"rejected": self.rejected, "prefix_hit_rate": self.prefix_hit_rate})


_OPTIONAL = ("replicas", "busy_ratio", "busy_ratio_max", "request_rate", "gpu_utilization",
             "requests_waiting",
             "prefix_cache_hit_ratio", "stalled_replicas", "targets_down")
_GROUPS: dict[str, type] = {"window": Window, "engine": EngineStats, "run": RunInfo}


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One window's figures; the optional fields are None where a source lacks them."""

    duration_s: float
    preemptions_per_min: float
    """Engine-wide: preemptions are not counted per class."""
    overall: ClassFigures
    classes: Mapping[Priority, ClassFigures]
    replicas: int | None = None
    busy_ratio: float | None = None
    """The share of the window the engines ran, averaged over replicas (0..1). From
    Prometheus, the mean of every replica's readings in the window, each replica counted
    for its time there; the direct scrape reads them as at the window's end."""
    busy_ratio_max: float | None = None
    """The busiest replica's share (0..1)."""
    request_rate: float | None = None
    """Arriving requests per second (not completions: a slow config must not read as a
    load shift)."""
    gpu_utilization: float | None = None
    """0..1 from DCGM where it reports the deployment's GPUs (the batching alert's figure)."""
    requests_waiting: float | None = None
    """Waiting requests at the window's end, summed over replicas (a gauge, not a rate)."""
    prefix_cache_hit_ratio: float | None = None
    """Prefix-cache hits over queries in the window; None where nothing was queried."""
    stalled_replicas: float | None = None
    """Replicas with requests waiting or running at the window's end that made no token
    in it (the stall alert's figure); None where the source cannot tell (the simulator,
    whose engines cannot stall)."""
    targets_down: float | None = None
    """Replicas deployed whose last scrape failed, or 1 where none is deployed (the
    targets-down alert's figure); None where nothing is scraped (the simulator)."""
    window: Window | None = None
    engine: EngineStats | None = None
    run: RunInfo | None = None

    def __post_init__(self) -> None:
        if set(self.classes) != set(Priority) or not all(
                isinstance(c, ClassFigures) for c in self.classes.values()):
            raise SummaryError(f"WindowSummary.classes: expected ClassFigures for each of "
                               f"p0, p1, p2, got {sorted(map(str, self.classes))}")
        # A plain dict in class order: equal summaries compare equal, and it pickles (the
        # simulator worker sends summaries between processes).
        object.__setattr__(self, "classes", {p: self.classes[p] for p in Priority})
        _check("WindowSummary", {n: getattr(self, n) for n in
                                 ("duration_s", "preemptions_per_min", *_OPTIONAL)}, _OPTIONAL)

    # ------------------------------------------------------------------ dict form
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (see the module docstring for the keys)."""
        out = self.overall.to_dict()
        out["duration_s"] = self.duration_s
        out["preemptions_per_min"] = self.preemptions_per_min
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in _GROUPS:
            group = getattr(self, name)
            if group is not None:
                out.update(dataclasses.asdict(group))
        if self.run is not None:
            out["config"] = dict(self.run.config)
        out["classes"] = {p.label: {**c.to_dict(), "preemptions_per_min":
                                    self.preemptions_per_min}
                          for p, c in self.classes.items()}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowSummary:
        """The dict form back, tolerant of what earlier versions stored in Optuna studies:
        NaN for an empty P99, keys since dropped (ignored) and keys added since (absent).
        A figure every version wrote that is missing raises SummaryError naming it."""
        if not isinstance(data, Mapping):
            raise SummaryError(f"summary: expected a mapping, got {type(data).__name__}")
        classes = data.get("classes")
        if not isinstance(classes, Mapping):
            raise SummaryError("summary lacks 'classes' (per-class figures under p0, p1, p2)")
        per: dict[Priority, ClassFigures] = {}
        for p in Priority:
            figures = classes.get(p.label)
            if not isinstance(figures, Mapping):
                raise SummaryError(f"summary['classes'] lacks {p.label!r}")
            per[p] = _class_from(figures, f"['classes'][{p.label!r}]")
        groups: dict[str, Any] = {}
        for name, kind in _GROUPS.items():
            fields = dataclasses.fields(kind)
            keys = [f.name for f in fields]
            required = [f.name for f in fields if f.default is dataclasses.MISSING]
            if all(k in data for k in required):
                groups[name] = kind(**{k: data[k] for k in keys if k in data})
        return cls(
            duration_s=_number(data, "", "duration_s"),
            preemptions_per_min=_number(data, "", "preemptions_per_min"),
            overall=_class_from(data, ""), classes=per,
            replicas=data.get("replicas"), busy_ratio=data.get("busy_ratio"),
            busy_ratio_max=_statistic(data, "", "busy_ratio_max"),
            gpu_utilization=_statistic(data, "", "gpu_utilization"),
            requests_waiting=_statistic(data, "", "requests_waiting"),
            prefix_cache_hit_ratio=_statistic(data, "", "prefix_cache_hit_ratio"),
            stalled_replicas=_statistic(data, "", "stalled_replicas"),
            targets_down=_statistic(data, "", "targets_down"),
            # Earlier versions stored NaN for "no traffic to tell".
            request_rate=_statistic(data, "", "request_rate"), **groups)


def _number(data: Mapping[str, Any], where: str, key: str) -> float:
    if key not in data:
        raise SummaryError(f"summary{where} lacks {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SummaryError(f"summary{where}[{key!r}]={value!r}: expected a number")
    return value


def _statistic(data: Mapping[str, Any], where: str, key: str) -> float | None:
    value = data.get(key)
    return None if value is None else or_none(_number(data, where, key))


def _count(data: Mapping[str, Any], where: str, key: str) -> float | None:
    """A count as written: an int stays one (``or_none`` makes a float of it, and tune's
    JSON, read back through here, said 264.0 where simulate's said 264); Prometheus' may
    be fractional, and NaN is None."""
    value = data.get(key)
    if value is None:
        return None
    value = _number(data, where, key)
    return value if isinstance(value, int) else or_none(value)


def _class_from(data: Mapping[str, Any], where: str) -> ClassFigures:
    samples = None
    if all(f.name in data for f in dataclasses.fields(SampleStats)
           if f.default is dataclasses.MISSING):
        samples = SampleStats(
            ttft_mean_ms=_statistic(data, where, "ttft_mean_ms"),
            ttft_p50_ms=_statistic(data, where, "ttft_p50_ms"),
            ttft_p90_ms=_statistic(data, where, "ttft_p90_ms"),
            tbt_p50_ms=_statistic(data, where, "tbt_p50_ms"),
            max_stall_ms=_number(data, where, "max_stall_ms"),
            ttft_measured_pct=_statistic(data, where, "ttft_measured_pct"))
    accounting = None
    if all(f.name in data for f in dataclasses.fields(RequestAccounting)):
        values: dict[str, Any] = {f.name: _number(data, where, f.name)
                                  for f in dataclasses.fields(RequestAccounting)}
        accounting = RequestAccounting(**values)
    return ClassFigures(
        requests_finished=_number(data, where, "requests_finished"),
        throughput_tok_s=_number(data, where, "throughput_tok_s"),
        goodput_tok_s=_number(data, where, "goodput_tok_s"),
        ttft_p99_ms=_statistic(data, where, "ttft_p99_ms"),
        tbt_p99_ms=_statistic(data, where, "tbt_p99_ms"),
        slo_attainment=_statistic(data, where, "slo_attainment"),
        # Absent before it was counted: none turned away, as those versions read it.
        requests_refused=(_number(data, where, "requests_refused")
                          if "requests_refused" in data else 0.0),
        samples=samples, accounting=accounting,
        ttft_samples=_count(data, where, "ttft_samples"),
        requests_awaiting=_count(data, where, "requests_awaiting"))
