"""The alert table: every alert's condition, hold and action, written once.

``alert_table(slo, options)`` is the only place an alert is defined. ``rules.py`` renders
each row as a Prometheus alerting rule over the deployment's recorded series, and
``alerts.SummaryAlerts`` evaluates the same rows on a window summary where no Prometheus
runs (the simulator, the demo's direct scrape); ``tests/tuner/test_alert_parity.py`` runs
one synthetic timeline through promtool and through Python and demands the same verdicts.
The texts (and, where tuning is off, the ``action`` label) also depend on an
``AlertContext``: how a TTFT P99 of no first token reads (the histograms' last finite
edges) and who acts (``AlertAdvice``); no condition or hold does. ``inhibitions.py``
renders the Alertmanager inhibit rules from the table's names.

Semantics, as Prometheus has them: a rule group is evaluated every ``interval_s``. An
alert whose condition holds at an evaluation becomes *pending* there (``activeAt``); it
*fires* at the first evaluation at which it has held for ``for_s`` (``now - activeAt >=
for``), and an evaluation where it does not hold, or reads no data, drops it. So a rule
with ``for: F`` fires at the ``1 + ceil(F / interval)``-th consecutive evaluation that
holds; "for N evaluation periods" is ``for: (N - 1) x interval``.

The seeds' table (docs/operations.md, Alerts) and where a default differs, on purpose:

=========================  =====================================  ========  ===========
alert                      condition                              action    hold
=========================  =====================================  ========  ===========
SlopilotTBTP99High         TBT P99 > 2 x SLO                      scale     3 evaluations
SlopilotTBTP99Sustained    TBT P99 over ``breach_window_s`` > SLO retune    ``sustained_for_s``
SlopilotTTFTP99High crit.  TTFT P99 > 2 x SLO (the seeds' 1 s      retune    ``alert_for_s``
                           for the 500 ms P1 SLO)
SlopilotTTFTP99High warn.  TTFT P99 > SLO                         inform    ``alert_for_s``
SlopilotTTFTP99Sustained   TTFT P99 over ``breach_window_s``      retune    ``sustained_for_s``
                           > SLO
SlopilotPreemptionStorm    preemptions per minute > 10            retune    ``alert_for_s``
SlopilotBatchingUnderused  utilization < 0.6 and waiting > 100    retune    ``alert_for_s``
SlopilotPrefixCacheHitLow  prefix hit ratio < 0.95 (if expected)  inform    ``alert_for_s``
SlopilotEngineStalled      replicas with requests in flight and   hold      ``alert_for_s``
                           no token made over the window (over
                           ``stall_lookback_s`` where it holds
                           too few samples) > 0
SlopilotTargetsDown        scrape targets down, or none left, > 0 hold      2 rate windows
                                                                           at least
=========================  =====================================  ========  ===========

The last two are not in the seeds: they say the deployment serves nothing, or cannot be
seen, where every figure the others read is missing (a P99 of no first token is NaN,
and a series not scraped is no data: those alerts clear). Their action is ``hold``: no
retune nor scale reaches a stuck executor or a target that is not scraped, so the loop
does neither (nor gives replicas back) while one fires. A request whose client left
before its first token, having waited past its TTFT target, is no such gap: the TTFT
figures count it as a first token never given (``latency_sources``), so the TTFT alerts
keep firing through a stall too.

Utilization is the GPU's (DCGM's ``DCGM_FI_DEV_GPU_UTIL``) where the exporter reports the
deployment's pods, else the built-in engine's busy ratio (vLLM exports none).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from slopilot.engine.latency_buckets import TOKEN_LATENCY_BUCKETS
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec

ALL_CLASSES = "all"


class RuleError(ValueError):
    """Rule rendering was given a bad name, selector or timing; the message names the fix."""


class AlertAction(enum.StrEnum):
    """What the controller does when the alert fires (its ``action`` label)."""

    RETUNE = "retune"
    SCALE = "scale"
    INFORM = "inform"
    HOLD = "hold"
    """The deployment serves nothing or cannot be seen: neither retune nor scale (up or
    down) while it fires; what it needs is a person, or the pods' restart."""


class AlertName(enum.StrEnum):
    """Every alert the rules define: the only names the controller reads back."""

    TBT_P99_HIGH = "SlopilotTBTP99High"
    TTFT_P99_HIGH = "SlopilotTTFTP99High"
    TTFT_P99_SUSTAINED = "SlopilotTTFTP99Sustained"
    TBT_P99_SUSTAINED = "SlopilotTBTP99Sustained"
    PREEMPTION_STORM = "SlopilotPreemptionStorm"
    BATCHING_UNDERUSED = "SlopilotBatchingUnderused"
    PREFIX_CACHE_HIT_LOW = "SlopilotPrefixCacheHitLow"
    ENGINE_STALLED = "SlopilotEngineStalled"
    TARGETS_DOWN = "SlopilotTargetsDown"


# The alerts whose rows read the long window (``breach_window_s``).
LONG_WINDOW_ALERTS = frozenset({AlertName.TTFT_P99_SUSTAINED.value,
                                AlertName.TBT_P99_SUSTAINED.value})
# The alerts that say an SLO is breached, whatever their action: each of their rows reads
# a term the objective judges (a class's P99, preemptions per minute) above a multiple >= 1
# of its limit. A scale-down waits for them to stop, an inform among them too (the TTFT
# warning). The prefix-cache and batching rows read no SLO term.
SLO_BREACH_ALERTS = frozenset({AlertName.TBT_P99_HIGH.value, AlertName.TBT_P99_SUSTAINED.value,
                               AlertName.TTFT_P99_HIGH.value,
                               AlertName.TTFT_P99_SUSTAINED.value,
                               AlertName.PREEMPTION_STORM.value})


class Severity(enum.StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class Figure(enum.StrEnum):
    """A figure an alert reads; the value is the recorded series that holds it."""

    TTFT_P99 = "slopilot:ttft_seconds:p99"
    TBT_P99 = "slopilot:tbt_seconds:p99"
    # The same P99s over ``breach_window_s`` rather than ``rate_window_s``.
    TTFT_P99_LONG = "slopilot:ttft_seconds:p99_long"
    TBT_P99_LONG = "slopilot:tbt_seconds:p99_long"
    PREEMPTIONS_PER_MIN = "slopilot:preemptions:per_minute"
    UTILIZATION = "slopilot:utilization:ratio"
    REQUESTS_WAITING = "slopilot:num_requests_waiting:sum"
    PREFIX_HIT_RATIO = "slopilot:prefix_cache_hit_ratio"
    STALLED_REPLICAS = "slopilot:stalled_replicas:count"
    """Replicas with requests in flight (waiting or running) that made no token over
    the window (over ``RuleOptions.stall_lookback_s`` where it holds too few samples)."""
    TARGETS_DOWN = "slopilot:scrape_targets_down:count"
    """Scrape targets whose last scrape failed; 1 where none is left at all (nor any of
    the deployment's engine gauges)."""

    @property
    def per_class(self) -> bool:
        return self in (Figure.TTFT_P99, Figure.TBT_P99, Figure.TTFT_P99_LONG,
                        Figure.TBT_P99_LONG)

    @property
    def long_window(self) -> bool:
        """Read over ``breach_window_s`` (the sustained-breach rows), not ``rate_window_s``."""
        return self in (Figure.TTFT_P99_LONG, Figure.TBT_P99_LONG)

    @property
    def is_ttft(self) -> bool:
        return self in (Figure.TTFT_P99, Figure.TTFT_P99_LONG)


# The figure each alert's value is: its first condition's, as Prometheus' ``$value``. The
# ALERTS series carry no value, so a reader of them looks it up in this series.
VALUE_FIGURE: dict[str, Figure] = {
    AlertName.TBT_P99_HIGH: Figure.TBT_P99,
    AlertName.TTFT_P99_HIGH: Figure.TTFT_P99,
    AlertName.TTFT_P99_SUSTAINED: Figure.TTFT_P99_LONG,
    AlertName.TBT_P99_SUSTAINED: Figure.TBT_P99_LONG,
    AlertName.PREEMPTION_STORM: Figure.PREEMPTIONS_PER_MIN,
    AlertName.BATCHING_UNDERUSED: Figure.UTILIZATION,
    AlertName.PREFIX_CACHE_HIT_LOW: Figure.PREFIX_HIT_RATIO,
    AlertName.ENGINE_STALLED: Figure.STALLED_REPLICAS,
    AlertName.TARGETS_DOWN: Figure.TARGETS_DOWN,
}


class Op(enum.StrEnum):
    ABOVE = ">"
    BELOW = "<"


MAX_DURATION_S = 86_400
"""The longest window or hold a rule may get. Prometheus refuses a duration past Go's
(about 2.5 million hours), and a Prometheus that loads every tenant's rules file then
refuses to start at all; a range over days is also what one tenant's rule should not ask
of a shared Prometheus. A day is beyond any sensible hold."""
STALL_LOOKBACK_S = 300
"""The window a replica's tokens are judged over where the rate window holds fewer than
two of its samples (``rules._Renderer.stalled_replicas``): two at any scrape interval up
to 2.5 minutes, Prometheus's default 60 s among them."""
MAX_SAID_SCRAPE_INTERVAL_S = 120
"""The longest scrape interval a deployment may say (``spec.alerts.scrapeInterval``): 8
minute rates. Past a few minutes Prometheus's 5 m lookback loses the gauges between
scrapes, which no window can mend."""
MIN_RATE_SCRAPES = 4
"""The scrape intervals a rate's range spans at least (Prometheus's own guidance): one
failed scrape, or one scrape late, still leaves it three samples. A review's promtool runs
at 30 s scrapes, two samples in the 60 s rates: one failed scrape cleared the 60 s
alerts (a P0 TTFT alert gap of 3.5 minutes), and with one failed every 180 s
``SlopilotTTFTP99High`` and ``SlopilotPreemptionStorm`` never fired in 15 minutes."""
MAX_WAITING = 1_000_000_000
"""The largest ``waiting_min``: above any queue, and a number PromQL reads exactly."""


@dataclass(frozen=True, slots=True)
class RuleOptions:
    """Timing and thresholds of the alerts (the SLO gives the targets they multiply).

    The defaults are the seeds' (docs/operations.md, Alerts) except ``alert_for_s``.
    """

    interval_s: int = 30
    """Group evaluation interval: also the unit of ``tbt_periods``."""
    rate_window_s: int = 60
    """Window of every rate(): at least ``MIN_RATE_SCRAPES`` scrape intervals
    (``rate_window_for``; ``spec.alerts.scrapeInterval`` sets it)."""
    alert_for_s: int = 120
    """``for:`` of every alert but TBT. The seeds give these alerts no hold; we hold 2
    minutes (they fire at the 5th evaluation at 30 s) on purpose: a P99 over a 60 s
    window moves with one burst, and a retune costs live trials on a canary, so one noisy
    evaluation must not start one."""
    tbt_periods: int = 3
    """The TBT alert fires at the 3rd consecutive evaluation over its threshold (seeds)."""
    tbt_factor: float = 2.0
    """TBT scales above this multiple of the class's TBT SLO (seeds: 2)."""
    ttft_warning_factor: float = 1.0
    """TTFT warns (action inform) above this multiple of the TTFT SLO (seeds: 1)."""
    ttft_retune_factor: float = 2.0
    """TTFT retunes (critical) above this multiple of the TTFT SLO: the seeds alert at 1 s
    for the standard 500 ms P1 SLO, i.e. at 2 x. Between the two a warning informs."""
    breach_window_s: int = 300
    """The window and the hold of the sustained-breach rows (``SlopilotTTFTP99Sustained``,
    ``SlopilotTBTP99Sustained``): a TTFT P99 over ``ttft_warning_factor`` x SLO, or a TBT
    P99 over its SLO, measured over this window rather than ``rate_window_s`` and held as
    long (``sustained_for_s``; a tail statistic over a long window crosses its threshold
    within seconds of a heavy breach, so the hold is what makes it a lasting one), retunes.
    The seeds act only above 2 x a TBT SLO and retune on every TTFT breach; we inform on a
    TTFT breach so one burst does not cost live trials, and these rows keep a lasting
    breach of either from being left alone. Over the long window a breach that flaps
    (most 60 s windows over the SLO, now and then one under it, which resets any ``for``
    on the short figure) still reads as the breach it is: a P99 over its SLO across 5
    minutes is a config that does not hold, not noise."""
    busy_ratio_min: float = 0.6
    """Batching is underused below this utilization (GPU utilization or busy ratio)."""
    waiting_min: int = 100
    """... while more than this many requests wait."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "rate_window_s", "tbt_periods", "waiting_min"):
            value = getattr(self, name)
            least = 0 if name == "waiting_min" else 1
            most = MAX_WAITING if name == "waiting_min" else MAX_DURATION_S
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not least <= value <= most:
                raise RuleError(f"{name}={value!r}: expected a whole number in "
                                f"[{least}, {most}]")
        if isinstance(self.alert_for_s, bool) or not isinstance(self.alert_for_s, int) \
                or not 0 <= self.alert_for_s <= MAX_DURATION_S:
            raise RuleError(f"alert_for_s={self.alert_for_s!r}: expected whole seconds in "
                            f"[0, {MAX_DURATION_S}] (a day)")
        if isinstance(self.breach_window_s, bool) or not isinstance(self.breach_window_s, int) \
                or not self.rate_window_s <= self.breach_window_s <= MAX_DURATION_S:
            raise RuleError(f"breach_window_s={self.breach_window_s!r}: expected whole "
                            f"seconds >= rate_window_s={self.rate_window_s} (a sustained "
                            "breach is read over a window at least as long as the others) "
                            f"and at most {MAX_DURATION_S} (a day)")
        if self.tbt_for_s > MAX_DURATION_S:
            raise RuleError(f"tbt_periods={self.tbt_periods!r}: {self.tbt_periods} "
                            f"evaluations {self.interval_s} s apart hold for more than "
                            f"{MAX_DURATION_S} s (a day); use fewer")
        for name in ("tbt_factor", "ttft_warning_factor", "ttft_retune_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 1:
                raise RuleError(f"{name}={value!r}: expected a multiple of the SLO >= 1 "
                                "(an alert inside the SLO would fire while it holds)")
        if self.ttft_warning_factor > self.ttft_retune_factor:
            raise RuleError(f"ttft_warning_factor={self.ttft_warning_factor!r} exceeds "
                            f"ttft_retune_factor={self.ttft_retune_factor!r}: the warning "
                            "must come first; lower it or raise the retune factor")
        ratio = self.busy_ratio_min
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise RuleError(f"busy_ratio_min={self.busy_ratio_min!r}: expected a ratio in (0, 1]")

    @property
    def max_scrape_interval_s(self) -> float:
        """The longest scrape interval the rates read as they should: ``MIN_RATE_SCRAPES``
        in the rate window (15 s at the default 60 s)."""
        return self.rate_window_s / MIN_RATE_SCRAPES

    @property
    def sustained_for_s(self) -> int:
        """``for:`` of the sustained-breach rows: the breach window, or the others' hold if
        that is longer."""
        return max(self.alert_for_s, self.breach_window_s)

    @property
    def stall_lookback_s(self) -> int:
        """Where the rate window holds too few samples of a replica's token counter (a
        scrape interval past half of it), its stall is judged over this window."""
        return max(self.rate_window_s, STALL_LOOKBACK_S)

    @property
    def tbt_for_s(self) -> int:
        """``for:`` of the TBT alert: N evaluations holding span N - 1 intervals."""
        return (self.tbt_periods - 1) * self.interval_s


def rate_window_for(scrape_interval_s: int, least_s: int = RuleOptions().rate_window_s
                    ) -> int:
    """The rate window of a deployment scraped every ``scrape_interval_s``: ``least_s``
    (the seeds' 60 s), or ``MIN_RATE_SCRAPES`` intervals where that is longer (2m at
    30 s scrapes). At the ServiceMonitor's 15 s it is the 60 s of before."""
    return max(least_s, MIN_RATE_SCRAPES * scrape_interval_s)


PREEMPTION_KNOBS = ("kv_watermark", "p0_preempt_utilization", "max_preemptions_per_step",
                    "preemption_mode")
"""The engine knobs that decide when and how the engine preempts."""
TUNING_OFF = ("tuning is off: the operator will not act; scale with spec.replicas / change "
              "spec.engine")
"""The advice of every row of a deployment whose ``spec.tuning.enabled`` is false."""


@dataclass(frozen=True, slots=True)
class AlertAdvice:
    """What the operator will do about a firing alert, which its texts and its ``action``
    label say: nothing where tuning is off."""

    tuning: bool = True
    """False: no controller runs (``spec.tuning.enabled`` false), so every row's action is
    ``inform`` (severity kept) and its advice ``TUNING_OFF``."""
    applied_knobs: frozenset[str] | None = None
    """The engine knobs the backend applies (``operator.knobs.VLLM_APPLIES`` on vLLM);
    None: every one (the built-in engine). Advice names no knob the backend ignores."""

    def applies(self, knob: str) -> bool:
        return self.applied_knobs is None or knob in self.applied_knobs

    def preemption(self) -> str:
        """What a preemption storm asks for, in the knobs the backend applies."""
        if any(self.applies(k) for k in PREEMPTION_KNOBS):
            return "retune the preemption thresholds or the KV watermark"
        # vLLM preempts when its KV cache runs out, and takes no threshold nor watermark:
        # fewer sequences, or fewer tokens, in a step hold less of it.
        fewer = [k for k in ("max_num_seqs", "token_budget") if self.applies(k)]
        retune = f"retune {' or '.join(fewer)} (fewer in flight hold less KV cache), or " \
            if fewer else ""
        return (f"the backend applies no preemption threshold nor KV watermark (it preempts "
                f"when its KV cache runs out): {retune}give the KV cache more GPU memory")

    def says(self, advice: str) -> str:
        """``advice`` where the controller acts on it, else what the person must do."""
        return advice if self.tuning else TUNING_OFF


ACTING = AlertAdvice()
"""The controller acts on the alerts (tuning on): every row's own action and advice."""


@dataclass(frozen=True, slots=True)
class AlertContext:
    """What the alerts' texts say beyond the SLO and the timing: how a TTFT P99 of no
    first token reads, and who acts. Nothing here moves a threshold or a hold."""

    ttft_last_edges: tuple[float, ...] = (TOKEN_LATENCY_BUCKETS[-1],)
    """The last finite edge of each histogram a TTFT P99 may be read from. A quantile in
    the +Inf bucket (more than 1 % of requests observed past the last edge, the first
    tokens never given among them: ``rules.bucket_rates``) reads that edge, which is no
    wait anyone measured; the descriptions say so instead of a duration."""
    advice: AlertAdvice = ACTING
    up_selector: str | None = None
    """The selector (``{...}`` text) of the deployment's ``up`` series, which the
    targets-down row's text queries to tell "none left" from a count down (both read 1);
    None (the Python evaluator's rows, no Prometheus to ask): it says "(or none left)"."""

    def __post_init__(self) -> None:
        edges = self.ttft_last_edges
        if not edges or any(isinstance(e, bool) or not isinstance(e, (int, float))
                            or not math.isfinite(e) or e <= 0 for e in edges):
            raise RuleError(f"ttft_last_edges={edges!r}: expected the last finite bucket "
                            "edge (seconds > 0) of each TTFT histogram the rules read")


@dataclass(frozen=True, slots=True)
class Condition:
    """``figure op threshold``; no value (or NaN) never holds, as in PromQL."""

    figure: Figure
    op: Op
    threshold: float
    """In the recorded series' unit: seconds for latencies."""

    def holds(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        return value > self.threshold if self.op is Op.ABOVE else value < self.threshold


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One row of the table: fires when every condition holds for ``for_s``."""

    name: str
    priority_class: str
    """p0/p1/p2 for the per-class figures, ``all`` for the engine-wide ones."""
    severity: Severity
    action: AlertAction
    conditions: tuple[Condition, ...]
    for_s: int
    summary: str
    description: str
    """Prometheus annotation templates (``{{ $value }}`` is the first condition's value)."""


def _ms(x: float) -> str:
    return f"{x:g} ms"


def _minutes(seconds: int) -> str:
    return f"{seconds // 60:g} min" if seconds % 60 == 0 else f"{seconds} s"


def _class_rows(p: Priority, slo: SLOSpec, o: RuleOptions, context: AlertContext
                ) -> list[AlertRule]:
    c, C, target = p.label, p.label.upper(), slo.class_slo(p)
    says = context.advice.says
    rows = []
    if target.tbt_p99_ms is not None:
        rows.append(AlertRule(
            AlertName.TBT_P99_HIGH.value, c, Severity.CRITICAL, AlertAction.SCALE,
            (Condition(Figure.TBT_P99, Op.ABOVE, o.tbt_factor * target.tbt_p99_ms / 1000),),
            o.tbt_for_s, f"{C} TBT P99 over {o.tbt_factor:g} x its SLO",
            f"{C} time between tokens P99 is {{{{ $value | humanizeDuration }}}}, over "
            f"{o.tbt_factor:g} x the {_ms(target.tbt_p99_ms)} SLO for {o.tbt_periods} "
            f"evaluations: {says('add replicas')}."))
        if o.tbt_factor > 1:  # at 1 x the scale alert already acts on every breach
            span = _minutes(o.breach_window_s)
            rows.append(AlertRule(
                AlertName.TBT_P99_SUSTAINED.value, c, Severity.WARNING, AlertAction.RETUNE,
                (Condition(Figure.TBT_P99_LONG, Op.ABOVE, target.tbt_p99_ms / 1000),),
                o.sustained_for_s, f"{C} TBT P99 over its SLO across {span}",
                f"{C} time between tokens P99 over the last {span} is {{{{ $value | "
                f"humanizeDuration }}}}, over its SLO of {_ms(target.tbt_p99_ms)}: "
                f"{says('retune the token budget and chunk size')}."))
    if target.ttft_p99_ms is not None:
        span = _minutes(o.breach_window_s)
        for name, figure, factor, severity, action, then in (
                (AlertName.TTFT_P99_HIGH, Figure.TTFT_P99, o.ttft_warning_factor,
                 Severity.WARNING, AlertAction.INFORM,
                 f"the controller retunes above {o.ttft_retune_factor:g} x, or when it holds "
                 f"across {span}"),
                (AlertName.TTFT_P99_HIGH, Figure.TTFT_P99, o.ttft_retune_factor,
                 Severity.CRITICAL, AlertAction.RETUNE, "retune the token budget and chunk size"),
                (AlertName.TTFT_P99_SUSTAINED, Figure.TTFT_P99_LONG, o.ttft_warning_factor,
                 Severity.WARNING, AlertAction.RETUNE,
                 "retune the token budget and chunk size")):
            if severity is Severity.WARNING and o.ttft_warning_factor == o.ttft_retune_factor:
                # The critical row retunes on this very condition, with the same hold: a
                # warning beside it would page twice for one breach (and cite a sustained
                # row that is not there). Equal factors are allowed (the CRD admits them).
                continue
            over = "over its SLO" if factor == 1 else f"over {factor:g} x its SLO"
            lasting = name is AlertName.TTFT_P99_SUSTAINED
            rows.append(AlertRule(
                name.value, c, severity, action,
                (Condition(figure, Op.ABOVE, factor * target.ttft_p99_ms / 1000),),
                o.sustained_for_s if lasting else o.alert_for_s,
                f"{C} TTFT P99 {over}" + (f" across {span}" if lasting else ""),
                f"{C} time to first token P99" + (f" over the last {span}" if lasting else "")
                + f" {{{{ if {_no_first_token(context)} }}}}is at the histogram's last "
                f"edge, {over} of {_ms(target.ttft_p99_ms)}: at least 1 % of requests got "
                f"no first token (refused for load or at the connection cap, abandoned "
                f"or still waiting). "
                f"{_no_first_token_advice(context.advice)}"
                f"{{{{ else }}}}is {{{{ $value | humanizeDuration }}}}, {over} of "
                f"{_ms(target.ttft_p99_ms)}: {says(then)}.{{{{ end }}}}"))
    return rows


def _no_first_token_advice(advice: AlertAdvice) -> str:
    """What a TTFT row says where its P99 reads no wait but the first tokens never given."""
    which = ("A stall, an outage or an overload, not a chunk size: SlopilotEngineStalled or "
             "SlopilotTargetsDown says which where it fires")
    if advice.tuning:
        return f"{which}, and the controller holds while it does (docs/operations.md, Alerts)."
    return f"{which} (docs/operations.md, Alerts); {TUNING_OFF}."


def _go_float(x: float) -> str:
    """A float literal a Go template compares with ``$value`` (a float64: an int literal
    would be an incompatible type)."""
    return repr(float(x))


def _no_first_token(context: AlertContext) -> str:
    """The Go template condition: ``$value`` is a TTFT histogram's last finite edge (the
    quantile in its +Inf bucket) or past the largest. A smaller histogram's edge is
    matched exactly: a larger histogram's quantile may read a real wait past it."""
    edges = sorted(set(context.ttft_last_edges))
    terms = [f"ge $value {_go_float(edges[-1])}"]
    terms += [f"eq $value {_go_float(e)}" for e in edges[:-1]]
    return terms[0] if len(terms) == 1 else "or " + " ".join(f"({t})" for t in terms)


def alert_table(slo: SLOSpec, options: RuleOptions, context: AlertContext = AlertContext()
                ) -> tuple[AlertRule, ...]:
    """Every alert of a deployment with this SLO, in the order the rules file lists them.
    ``context``: what the texts say (``AlertContext``); no condition depends on it."""
    o, says = options, context.advice.says
    rows = [row for p in Priority for row in _class_rows(p, slo, o, context)]
    limit = slo.max_preemptions_per_min
    if limit is not None:
        rows.append(AlertRule(
            AlertName.PREEMPTION_STORM.value, ALL_CLASSES, Severity.WARNING, AlertAction.RETUNE,
            (Condition(Figure.PREEMPTIONS_PER_MIN, Op.ABOVE, limit),), o.alert_for_s,
            "preemption storm",
            f"{{{{ $value | printf \"%.1f\" }}}} preemptions per minute, over the limit of "
            f"{limit:g}: {says(context.advice.preemption())}."))
    rows.append(AlertRule(
        AlertName.BATCHING_UNDERUSED.value, ALL_CLASSES, Severity.WARNING, AlertAction.RETUNE,
        (Condition(Figure.UTILIZATION, Op.BELOW, o.busy_ratio_min),
         Condition(Figure.REQUESTS_WAITING, Op.ABOVE, o.waiting_min)), o.alert_for_s,
        "batching underused while requests wait",
        f"The GPU (or the executor) is busy {{{{ $value | humanizePercentage }}}} of the "
        f"time while more than {o.waiting_min} requests wait: "
        f"{says('raise the token budget or max_num_seqs')}."))
    hit_min = slo.prefix_hit_min
    if hit_min is not None:
        rows.append(AlertRule(
            AlertName.PREFIX_CACHE_HIT_LOW.value, ALL_CLASSES, Severity.INFO, AlertAction.INFORM,
            (Condition(Figure.PREFIX_HIT_RATIO, Op.BELOW, hit_min),), o.alert_for_s,
            "prefix cache hit ratio low",
            f"Prefix cache hit ratio is {{{{ $value | humanizePercentage }}}}, under the "
            # A percentage, as humanizePercentage writes the value beside it.
            f"expected {hit_min * 100:g}%: the traffic may no longer share prefixes."))
    rows.append(AlertRule(
        AlertName.ENGINE_STALLED.value, ALL_CLASSES, Severity.CRITICAL, AlertAction.HOLD,
        (Condition(Figure.STALLED_REPLICAS, Op.ABOVE, 0),), o.alert_for_s,
        "engine stalled: requests in flight, no token made",
        f"{{{{ $value }}}} replica(s) held requests waiting or running and made no token "
        f"over {_minutes(o.rate_window_s)} (over {_minutes(o.stall_lookback_s)} where "
        "scrapes too far apart leave fewer than two in that window), "
        f"for {_minutes(o.alert_for_s)}: the executor or the engine is stuck. "
        f"{_held(context.advice)}; restart the stuck pods (docs/operations.md, Alerts)."))
    # Through two rate windows at least: with the short windows of the demo (a scrape a
    # second, its timeout as long), a scrape or two a busy machine's Prometheus missed
    # read as an outage and held the loop. The cluster's defaults: 2 min either way.
    down_for = max(o.alert_for_s, 2 * o.rate_window_s)
    rows.append(AlertRule(
        AlertName.TARGETS_DOWN.value, ALL_CLASSES, Severity.CRITICAL, AlertAction.HOLD,
        (Condition(Figure.TARGETS_DOWN, Op.ABOVE, 0),), down_for,
        "scrape targets down or gone",
        f"{_targets_down(context)} for {_minutes(down_for)}: its figures are missing, and "
        f"the alerts that read them have cleared. {_held(context.advice)}; check the pods and the "
        "ServiceMonitor (docs/operations.md, Alerts)."))
    if not context.advice.tuning:  # nobody acts: no row may say the controller will
        rows = [dataclasses.replace(row, action=AlertAction.INFORM) for row in rows]
    return tuple(rows)


def _targets_down(context: AlertContext) -> str:
    """How many targets are down, or that none is left: the figure reads 1 either way
    (``rules._Renderer.targets_down``), so the text asks Prometheus whether any ``up`` of
    the deployment is left, as the rule's ``absent`` did."""
    count = "{{ $value }} scrape target(s) of the deployment down"
    sel = context.up_selector
    if sel is None or "`" in sel:  # a Go raw string cannot hold a backquote
        return f"{count} (or none left)"
    return (f"{{{{ with query `absent(up{sel})` }}}}no scrape target of the deployment "
            f"left{{{{ else }}}}{count}{{{{ end }}}}")


def _held(advice: AlertAdvice) -> str:
    """The hold rows' word on the controller."""
    if advice.tuning:
        return "The controller neither retunes nor scales while it fires"
    return "Tuning is off: the operator will not act"


def latency_thresholds(slo: SLOSpec, options: RuleOptions, *, ttft: bool
                       ) -> dict[str, tuple[float, ...]]:
    """Per class, every threshold (seconds) its TTFT (``ttft``) or TBT P99 is judged
    against: the table's rows and the SLO itself (a trial's verdict, the goodput). The
    rules read a P99 so that none of them is claimed breached where the histogram's
    buckets cannot prove it (``rules.judged_buckets``); a class without one: left out."""
    out: dict[str, set[float]] = {}
    for p, target in slo.classes().items():
        ms = target.ttft_p99_ms if ttft else target.tbt_p99_ms
        if ms is not None:
            out.setdefault(p.label, set()).add(ms / 1000)
    for row in alert_table(slo, options):
        for cond in row.conditions:
            if cond.figure.per_class and cond.figure.is_ttft == ttft:
                out.setdefault(row.priority_class, set()).add(cond.threshold)
    return {cls: tuple(sorted(values)) for cls, values in out.items()}
