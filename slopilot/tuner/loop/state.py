"""The controller's lifecycle, settings, persisted state and per-tick decision.

Everything the controller must remember across an operator restart lives in
``LoopState`` and round-trips through plain JSON (``to_dict``/``from_dict``): the
operator keeps it in the LLMDeployment's status, so a restarted operator picks up a
running trial instead of applying or counting it twice.
"""

from __future__ import annotations

import enum
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slopilot.engine.sim.quote import excerpt
from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary


class ControllerState(enum.StrEnum):
    STEADY = "steady"
    TUNING = "tuning"
    COMMIT = "commit"
    COOLDOWN = "cooldown"
    SCALING = "scaling"


class Action(enum.StrEnum):
    """What one tick did; counted in slopilot_tuner_actions_total{action}."""

    NONE = "none"
    HOLD = "hold"  # kept the current config on purpose (Prometheus down, rate limit)
    RETUNE = "retune"  # started a tuning episode
    TRIAL = "trial"  # applied a trial config
    REPEAT = "repeat"  # a window that is no verdict yet (rejected, or a confirming one)
    COMMIT = "commit"
    REVERT = "revert"  # a trial cut short, or a rollback after an error
    COOLDOWN = "cooldown"
    SCALE = "scale"
    INFORM = "inform"


class TwinCorrection(enum.StrEnum):
    """How the controller corrects its twin from the last window's iterations."""

    NONE = "none"  # check only: a twin off by more than the bound is not trusted
    RESCALE = "rescale"  # every coefficient times one factor
    REFIT = "refit"  # one factor per feature (pulled towards the profile), then rescaled


class TrialOutcome(enum.StrEnum):
    """slopilot_tuner_trials_total{state}."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"
    REVERTED = "reverted"


class ControllerError(ValueError):
    """Bad controller settings or persisted state; the message names the field and fix."""


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
    fired on, are still finishing then, and would score the trial by their latencies."""
    max_trials: int = 20
    """Live trials in one tuning episode before the best is committed."""
    max_trials_per_hour: int = 30
    cooldown_s: float = 300.0
    """No new tuning or scaling for this long after a commit or a scale."""
    max_backoff_s: float = 3600.0
    """At max replicas with nothing holding, no new episode for the same situation for
    twice ``cooldown_s``, doubling after each such verdict up to this (``backoff.py``)."""
    breach_window_s: float = 300.0
    """The window of the sustained-breach alerts (``RuleOptions.breach_window_s``): they
    count only once this long has passed since the last commit or scale, so a breach
    measured partly under the config before it does not start another round. Also the
    longest window that re-confirms an alert held since before that action
    (``steady._unconfirmed``)."""
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
        if not isinstance(self.twin_correction, TwinCorrection):
            try:
                object.__setattr__(self, "twin_correction",
                                   TwinCorrection(self.twin_correction))
            except ValueError:
                raise ControllerError(
                    f"twin_correction={self.twin_correction!r}: use one of "
                    f"{', '.join(c.value for c in TwinCorrection)}") from None
        settle = self.trial_settle_s
        if settle is not None and (isinstance(settle, bool) or not isinstance(
                settle, (int, float)) or not 0 <= settle <= self.window_s / 2):
            raise ControllerError(f"trial_settle_s={settle!r}: expected seconds in "
                                  f"[0, window_s / 2 = {self.window_s / 2:g}], so that "
                                  "most of a trial's window is measured")
        check = self.revert_check_s
        if check is not None and not 0 < check <= self.window_s:
            raise ControllerError(f"revert_check_s={check!r}: expected a time in "
                                  f"(0, window_s={self.window_s}]")

    @property
    def key(self) -> str:
        """``namespace/name`` (the name alone outside a namespace): what the logs say."""
        return f"{self.namespace}/{self.deployment}" if self.namespace else self.deployment

    @property
    def settle_s(self) -> float:
        """``trial_settle_s``, or its default."""
        return self.trial_settle_s if self.trial_settle_s is not None else self.window_s / 10

    @property
    def revert_after_s(self) -> float:
        return self.revert_check_s if self.revert_check_s is not None else self.window_s / 4


@dataclass
class RunningTrial:
    number: int
    config: dict[str, Any]
    started_at: float
    """Start of the current window (moved on a repeat or after Prometheus returns)."""
    canary: bool
    repeats: int = 0
    warm: bool = False
    canary_replica: str | None = None
    """Which replica the trial runs on (the handle's answer), kept so that a resumed
    controller measures and restores the same one."""
    edge_constraints: list[float] | None = None
    """The SLO terms of a first window that held within ``objective.HEADROOM`` of a limit
    (None otherwise): the trial is then on its confirming window, judged on both."""
    edge_goodput: float | None = None
    """That first window's goodput (tokens/s)."""


@dataclass
class LoopState:
    """What the controller remembers; JSON-safe via to_dict/from_dict."""

    state: ControllerState = ControllerState.STEADY
    since: float = 0.0
    reason: str = "start"
    baseline_config: dict[str, Any] | None = None
    """The config before this episode: the rollback target when nothing better is known.
    Kept after the episode as its record, never applied then (``rollback_config``)."""
    best_config: dict[str, Any] | None = None
    best_goodput: float | None = None
    """Best feasible live result of this episode (goodput, tokens/s); after a commit, the
    committed config, kept as the record of the last episode."""
    trial: RunningTrial | None = None
    episode_trials: int = 0
    episode_feasible: int = 0
    trial_starts: list[float] = field(default_factory=list)
    """Starts of live trials in the last hour (the per-hour limit)."""
    episode_classes: list[str] = field(default_factory=list)
    """The classes (``p0``..``p2``) of the alerts that started this episode: a trial's
    window that measured none of one of them is no verdict (``trial_window._no_verdict``)."""
    episode_measured: int | None = 0
    """Trials of this episode judged on a measured window (scored, or cut by the early
    look): the others failed unseen (windows rejected, no data, refused, an outage), and
    an episode of only those is no evidence that a replica is needed (``commit``). None:
    not known, a state written before this field (``from_dict``). Read as 0, an episode
    an older version left open ended without the replica its measured misses asked for,
    its reason saying nothing was measured; unknown, it ends as that version ended it, and
    its next measured trial makes the count 1 (at least one: all ``commit`` asks)."""
    episode_warm_starts: int = 0
    """Warm starts queued for this episode (tried first): how many a rate-limited end
    left untried, for the decision's reason."""
    episode_alerts: list[str] = field(default_factory=list)
    """The alerts (``Alert.describe()``) that acted when this episode began: a scale alert
    among them is what the episode answers; any other ends it (``episode.tuning``)."""
    cooldown_until: float | None = None
    headroom_since: float | None = None
    prometheus_unavailable: bool = False
    scale_reason: str | None = None
    """Why SCALING was entered: 'alert', 'no_feasible_config' (live evidence), ..."""
    twin: dict[str, Any] | None = None
    """The last twin check (``TwinCheck.to_dict``): what the status reports."""
    backoff: dict[str, Any] | None = None
    """The last "max replicas reached and the SLO is not held" verdict, its situation and
    until when no new episode starts in it (``backoff.Backoff.to_dict``)."""

    def count_measured(self) -> None:
        """One more trial of the episode judged on a measured window."""
        self.episode_measured = (self.episode_measured or 0) + 1

    @property
    def episode_open(self) -> bool:
        """Whether a tuning episode is under way (TUNING, COMMIT)."""
        return self.state in (ControllerState.TUNING, ControllerState.COMMIT)

    def rollback_config(self) -> dict[str, Any] | None:
        """What a rollback applies: the open episode's best, else the config it began on.

        None outside an episode: nothing the loop applied is left to undo, and the last
        episode's configs are a record, not the deployment's config. Its commit became
        the deployment's own (in the operator, ``status.tunedConfig``, which belongs to
        the spec it was committed under), and a later edit of the spec may have left it
        behind: applied after the edit, it undid the edit.
        """
        if not self.episode_open:
            return None
        return self.best_config or self.baseline_config

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoopState:
        """The state ``to_dict`` wrote; ControllerError naming the field for anything
        else (the status it lives in is anyone's with status rights to write)."""
        if not isinstance(data, Mapping):
            raise ControllerError(f"controller state: expected a mapping, got "
                                  f"{type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ControllerError(f"controller state: unknown field(s) {unknown}; "
                                  "was it written by a newer slopilot?")
        values = dict(data)
        # Written before the count was kept: not known, which is not "none measured".
        values.setdefault("episode_measured", None)
        try:
            values["state"] = ControllerState(values.get("state", "steady"))
        except (ValueError, TypeError):
            raise ControllerError(
                f"controller state: state={excerpt(data.get('state'))}; use one of: "
                f"{', '.join(s.value for s in ControllerState)}") from None
        _check_fields(cls, values, "", skip=("state", "trial"))
        trial = values.get("trial")
        if trial is not None:
            if not isinstance(trial, Mapping):
                raise ControllerError(f"controller state: trial={excerpt(trial)}: expected "
                                      "a mapping")
            _check_fields(RunningTrial, trial, "trial.")
            try:
                values["trial"] = RunningTrial(**trial)
            except TypeError as exc:
                raise ControllerError(f"controller state: trial={excerpt(trial)}: {exc}"
                                      ) from None
        values["trial_starts"] = [float(t) for t in values.get("trial_starts") or []]
        return cls(**values)


_HINTS: dict[type, dict[str, Any]] = {}

_MAY_BE_NEGATIVE = frozenset({"edge_constraints"})
"""The numbers of the state that may be below zero (a constraint below zero held). Every
other is a count, a trial number, goodput or a clock reading: below zero, a count let an
episode run past ``max_trials`` (-1000: 1020 trials) and a trial's window be rejected
past ``max_window_repeats``, and a time was no reading of any clock the loop runs on."""


def _check_fields(cls: type, values: Mapping[str, Any], prefix: str,
                  skip: tuple[str, ...] = ()) -> None:
    """Each of ``values`` of the type ``cls`` declares for it (numbers finite, and none
    below zero but ``_MAY_BE_NEGATIVE``'s)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    for name, value in values.items():
        hint = _HINTS[cls].get(name)
        if name in skip or hint is None:
            continue
        if not _conforms(value, hint):
            raise ControllerError(f"controller state: {prefix}{name}={excerpt(value)}: "
                                  f"expected {_type_name(hint)}")
        if name not in _MAY_BE_NEGATIVE and _below_zero(value):
            raise ControllerError(f"controller state: {prefix}{name}={excerpt(value)}: "
                                  "expected >= 0 (a count, a trial number, goodput or a "
                                  "time)")


def _below_zero(value: Any) -> bool:
    """Whether ``value`` (as ``_conforms`` passed it) is, or lists, a number below zero;
    a config's knobs (a mapping) are the engine's config to judge."""
    if isinstance(value, list):
        return any(_below_zero(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if origin is dict:
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    return True  # a type of its own (an enum, a dataclass): judged where it is built


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    names = {float: "a finite number", int: "a whole number", str: "a string",
             bool: "true or false", type(None): "null"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return {float: "a list of numbers", str: "a list of strings"}.get(item, "a list")
    return {dict: "a mapping"}.get(origin, str(hint))



@dataclass(frozen=True)
class Decision:
    """The outcome of one tick: what happened and why, for logs, status and the demo."""

    state: ControllerState
    action: Action
    reason: str
    replicas: int
    prometheus_unavailable: bool = False
    trial: int | None = None
    config: Mapping[str, Any] | None = None
    summary: WindowSummary | None = None
    """Figures behind the decision (a measured window), when there were some."""
    twin: Mapping[str, Any] | None = None
    """The twin check this tick ran (``TwinCheck.to_dict``), if it ran one."""

    def line(self) -> str:
        parts = [f"state={self.state.value}", f"action={self.action.value}",
                 f"replicas={self.replicas}"]
        if self.trial is not None:
            parts.append(f"trial={self.trial}")
        if self.prometheus_unavailable:
            parts.append("prometheus_unavailable=true")
        if self.config is not None and self.action is not Action.NONE:
            parts.append("config=" + ",".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in sorted(self.config.items())))
        return " ".join(parts) + f" reason={self.reason}"
