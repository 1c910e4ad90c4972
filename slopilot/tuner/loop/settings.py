"""How one deployment's loop behaves: ``ControllerSettings``, checked when built."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from slopilot.engine.alert_factors import DEFAULT_FACTORS, AlertFactors
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.loop.errors import ControllerError

MAX_CLASS_REQUESTS = 100_000
"""Past this a trial's window would run for days at any load a replica serves."""
DEFAULT_CLASS_REQUESTS = 100
DEFAULT_MAX_TRIAL_S = 1200.0
DEFAULT_TRIALS_PER_HOUR = 30
DEFAULT_ROLLOUT_TIMEOUT_S = 1200.0
"""The default Deployment's progress deadline (900 s: a 10 min startup budget and 5 min
to schedule and pull) and 5 minutes more."""
ROLLOUT_TIMEOUT_BOUNDS = (60.0, 86_400.0)
DEFAULT_REPLICA_READY_S = 900.0
"""A model's default startup budget (10 minutes, the operator's ``startupTimeout``) and
5 minutes to pull and schedule: the Deployment's progress deadline."""
MAX_REPLICA_READY_S = 86400.0
MAX_HOLD_DOUBLINGS = 3
"""A refusal of replicas repeated at the same cap (``scale_wait.py``) holds the next
scale-ups for at most 2**3 = 8 times ``max_backoff_s`` (8 h by default: strikes hold 1,
2, 4, then 8 h). A quota is raised by a person, on a working day's scale: each try costs
``replica_ready_s`` of Pending pods and may cost a cluster-autoscaler's GPU node, so an
hourly try was 24 a day and this is at most 3, while a quota raised without a hand scale
is still used within a working day (one raised and scaled by hand ends the hold at once).
A day (24 x) would leave a quota raised on Monday morning unused until Tuesday."""

class TwinCorrection(enum.StrEnum):
    """How the controller corrects its twin from the last window's iterations."""

    NONE = "none"  # check only: a twin off by more than the bound is not trusted
    RESCALE = "rescale"  # every coefficient times one factor
    REFIT = "refit"  # one factor per feature (pulled towards the profile), then rescaled


def default_hourly_trials(max_trials: int) -> int:
    """The hourly live-trial cap a loop of ``max_trials`` an episode gets by default:
    ``DEFAULT_TRIALS_PER_HOUR``, raised to ``max_trials`` so one episode runs them all."""
    return max(DEFAULT_TRIALS_PER_HOUR, max_trials)


@dataclass(frozen=True)
class ControllerSettings:
    """How one deployment's loop behaves. Times are in seconds of the caller's clock."""

    deployment: str
    """The deployment's name: its series' ``slopilot_deployment``, as the engines' are."""
    slo: SLOSpec
    namespace: str = ""
    """Its namespace where it has one (Kubernetes): log lines say ``namespace/name``."""
    min_replicas: int = 1
    max_replicas: int = 8
    window_s: float = 120.0
    """How long a trial config runs before its window is measured."""
    trial_settle_s: float | None = None
    """The first seconds of a trial's window that are not measured (default: a tenth of
    ``window_s``): requests that arrived under the config before it, the one an alert
    fired on, are still finishing then, and would score the trial by their latencies. A
    trial that inherited a queue longer than that waits it out first (``backlog_wait.py``)
    and settles from the drain: the few requests still waiting then are served within the
    SLO's TTFT target, which a settle of 0 would count."""
    max_trials: int = 20
    """Live trials in one tuning episode before the best is committed."""
    max_trials_per_hour: int | None = None
    """Live trials started in any hour, across episodes (``hourly_trials``): an alert
    that keeps firing starts round after round, each of up to ``max_trials`` trials on
    the live deployment, and this bounds what they cost together (the review's r2: 41
    rounds and 124 trials in six hours). None: ``DEFAULT_TRIALS_PER_HOUR`` or
    ``max_trials`` where that is more, so one episode runs every trial it was given and
    its verdict that nothing holds (a replica bought on live evidence) is reachable; a
    value below ``max_trials`` is a tighter budget asked for, and kept."""
    cooldown_s: float = 300.0
    """No new tuning or scaling for this long after a commit or a scale."""
    max_backoff_s: float = 3600.0
    """At max replicas with nothing holding, no new episode for the same situation for
    twice ``cooldown_s``, doubling after each such verdict up to this (``backoff.py``)."""
    replica_ready_s: float = DEFAULT_REPLICA_READY_S
    """After a scale-up, how long the loop waits for the replicas it bought to serve
    before it judges capacity again (``scale_wait.py``): a GPU pod's start, its image
    pulled, scheduled and its model loaded. Past it, the replicas still not ready are
    said (an inform naming why: a quota, no node with a free GPU) and the loop judges on
    the ones that serve."""
    breach_window_s: float = 300.0
    """The window of the sustained-breach alerts (``RuleOptions.breach_window_s``): they
    count only once their rule's last evaluation read this long entirely after the last
    commit or scale took effect, so a breach measured partly under the config before it
    does not start another round (``steady._read_after``). Also the longest window that
    re-confirms an alert held since before that action (``steady._unconfirmed``)."""
    revert_margin: float = 1.0
    """A trial with a P99 (TTFT or TBT) of any class over its SLO by more than this
    fraction (1.0: twice the SLO) is cut short and reverted at once."""
    revert_check_s: float | None = None
    """Earliest time into a trial the revert check looks (default: a quarter window)."""
    max_window_repeats: int = 3
    """A trial whose window is rejected this many times in a row counts as failed."""
    scale_down_after_s: float = 900.0
    """Quiet alerts and spare simulated capacity for this long before scaling down."""
    canary: bool = True
    """Trials run on one canary replica when there are several."""
    warm_start_k: int = 3
    """Best offline configurations enqueued into the live study at each episode."""
    twin_max_error: float = 0.15
    """The twin is trusted (warm starts, capacity plans) while its corrected step-time
    error on the last window, |predicted - measured| / measured, is at most this."""
    twin_max_latency_error: float | None = None
    """Also require the P0 TTFT and TBT p99 predicted for the last window within this
    relative error of the measured ones (None: reported, not required)."""
    twin_correction: TwinCorrection = TwinCorrection.REFIT
    alert_factors: AlertFactors = DEFAULT_FACTORS
    """The multiples of the SLO the deployment's pods carry as histogram edges
    (``spec.alerts``, given them as ``alerts.json``: ``alert_spec.edge_factors``): the
    twin check reads its predicted P99s through the same edges
    (``latency_buckets.token_latency_buckets``), so a P99 near an alert's threshold falls
    on the side of it the pods' histograms read, not the default factors' bucket."""
    min_class_requests: int = DEFAULT_CLASS_REQUESTS
    """A trial's window is judged only once it holds this many finished requests of each
    class with a P99 in the SLO that it served: the P99 of fewer than 100 is their
    maximum, one of a few largest, and a config 1.25 x over the SLO passed on 12
    requests a third of the time. Until then the window is extended (its figures pooled
    since the trial settled), up to ``max_trial_s``."""
    max_trial_s: float = DEFAULT_MAX_TRIAL_S
    """The longest one window of a trial runs, each from its own start (the first, and a
    confirming one: counted from the trial's start, a first window that needed most of it
    left its confirming one too little): a trial that reaches it
    short of ``min_class_requests`` ends without a verdict (too little traffic to judge),
    rolled back, and the episode with it. The wait for a backlog the trial inherited
    (``backlog_wait.py``) comes before its first window and is not counted in it; it is
    bounded by this too, from the apply: a trial runs at most about twice this."""
    rollout_timeout_s: float = DEFAULT_ROLLOUT_TIMEOUT_S
    """The loop's own bound on a rollout (vLLM's configs are new pods): one whose
    progress (``Pending.progress``) has not moved for this long is stuck, as if the
    Deployment controller had said ``ProgressDeadlineExceeded``, which it never does
    when it is down, lags, or the Deployment lost its ``progressDeadlineSeconds``.
    Longer than that deadline, so the controller's word comes first where it comes
    (the operator: the deadline and ``ROLLOUT_MARGIN_S``)."""

    def __post_init__(self) -> None:
        if not self.deployment:
            raise ControllerError("deployment is empty; pass the deployment's name")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ControllerError(
                f"replicas min={self.min_replicas} max={self.max_replicas}: need "
                "1 <= min <= max")
        for name in ("window_s", "cooldown_s", "scale_down_after_s", "revert_margin",
                     "breach_window_s", "max_backoff_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ControllerError(f"{name}={value!r}: expected a positive number")
        for name in ("max_trials", "max_trials_per_hour", "max_window_repeats",
                     "warm_start_k"):
            value = getattr(self, name)
            if name == "max_trials_per_hour" and value is None:
                continue  # the default: ``hourly_trials``
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ControllerError(f"{name}={value!r}: expected a whole number >= 1")
        for name in ("twin_max_error", "twin_max_latency_error"):
            bound = getattr(self, name)
            if bound is None and name == "twin_max_latency_error":
                continue
            if isinstance(bound, bool) or not isinstance(bound, (int, float)) \
                    or not 0 < bound < 10:
                raise ControllerError(f"{name}={bound!r}: expected a relative error in "
                                      "(0, 10), e.g. 0.15 for 15 %")
        if not isinstance(self.alert_factors, AlertFactors):
            raise ControllerError(f"alert_factors={self.alert_factors!r}: expected an "
                                  "AlertFactors (alert_spec.edge_factors of spec.alerts)")
        if not isinstance(self.twin_correction, TwinCorrection):
            try:
                object.__setattr__(self, "twin_correction",
                                   TwinCorrection(self.twin_correction))
            except ValueError:
                raise ControllerError(
                    f"twin_correction={self.twin_correction!r}: use one of "
                    f"{', '.join(c.value for c in TwinCorrection)}") from None
        ready = self.replica_ready_s
        if isinstance(ready, bool) or not isinstance(ready, (int, float)) \
                or not 0 < ready <= MAX_REPLICA_READY_S:
            raise ControllerError(
                f"replica_ready_s={ready!r}: expected seconds in (0, {MAX_REPLICA_READY_S:g}]"
                f" that a new replica takes to serve (default {DEFAULT_REPLICA_READY_S:g}: "
                "a model's startup budget and the scheduling), e.g. 900")
        settle = self.trial_settle_s
        if settle is not None and (isinstance(settle, bool) or not isinstance(
                settle, (int, float)) or not 0 <= settle <= self.window_s / 2):
            raise ControllerError(f"trial_settle_s={settle!r}: expected seconds in "
                                  f"[0, window_s / 2 = {self.window_s / 2:g}], so that "
                                  "most of a trial's window is measured")
        floor = self.min_class_requests
        if isinstance(floor, bool) or not isinstance(floor, int) \
                or not 1 <= floor <= MAX_CLASS_REQUESTS:
            raise ControllerError(
                f"min_class_requests={floor!r}: expected a whole number of requests in "
                f"[1, {MAX_CLASS_REQUESTS}] (default 100: the P99 of fewer is one of "
                "their few largest; set it lower only to judge trials on less)")
        cap = self.max_trial_s
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) \
                or not math.isfinite(cap) or not cap >= self.window_s:
            raise ControllerError(
                f"max_trial_s={cap!r}: expected seconds >= window_s={self.window_s:g} "
                "(a trial runs one window at least), e.g. 1200")
        bound = self.rollout_timeout_s
        lo, hi = ROLLOUT_TIMEOUT_BOUNDS
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) \
                or not lo <= bound <= hi:
            raise ControllerError(
                f"rollout_timeout_s={bound!r}: expected seconds in [{lo:g}, {hi:g}], past "
                "the Deployment's progressDeadlineSeconds (the controller's own verdict "
                f"comes first), e.g. {DEFAULT_ROLLOUT_TIMEOUT_S:g} for the default 900")
        check = self.revert_check_s
        if check is not None and not 0 < check <= self.window_s:
            raise ControllerError(f"revert_check_s={check!r}: expected a time in "
                                  f"(0, window_s={self.window_s}]")

    @property
    def key(self) -> str:
        """``namespace/name`` (the name alone outside a namespace): what the logs say."""
        return f"{self.namespace}/{self.deployment}" if self.namespace else self.deployment

    @property
    def hourly_trials(self) -> int:
        """``max_trials_per_hour`` where set, else its default, which is never below
        ``max_trials``."""
        if self.max_trials_per_hour is not None:
            return self.max_trials_per_hour
        return default_hourly_trials(self.max_trials)

    @property
    def settle_s(self) -> float:
        """``trial_settle_s``, or its default."""
        return self.trial_settle_s if self.trial_settle_s is not None else self.window_s / 10

    @property
    def revert_after_s(self) -> float:
        return self.revert_check_s if self.revert_check_s is not None else self.window_s / 4
