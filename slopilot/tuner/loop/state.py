"""The controller's lifecycle and the persisted state it resumes from.

Everything the controller must remember across an operator restart lives in
``LoopState`` and round-trips through plain JSON (``to_dict``/``from_dict``): the
operator keeps it in the LLMDeployment's status, so a restarted operator picks up a
running trial instead of applying or counting it twice.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slopilot.engine.sim.quote import excerpt
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state_fields import check_fields, texts_read

log = logging.getLogger(__name__)


class ControllerState(enum.StrEnum):
    STEADY = "steady"
    TUNING = "tuning"
    COMMIT = "commit"
    COOLDOWN = "cooldown"
    SCALING = "scaling"


@dataclass
class RunningTrial:
    number: int
    config: dict[str, Any]
    started_at: float
    """Start of the current window: when the trial's apply returned (the controller's
    clock, ``LoopContext.took_effect``); moved on a repeat, a confirming window, a
    rollout's end, a drained backlog or after Prometheus returns."""
    canary: bool
    repeats: int = 0
    warm: bool = False
    canary_replica: str | None = None
    """Which replica the trial runs on (the handle's answer), kept so that a resumed
    controller measures and restores the same one."""
    edge_constraints: list[float] | None = None
    """The SLO terms of a first window that held within ``objective.HEADROOM`` of a limit
    (None otherwise): the trial is then on its confirming window, judged on both, the
    first measured again (``edge_from``) and judged by the SLO then in force, which an
    edit may have changed since these terms."""
    edge_goodput: float | None = None
    """That first window's goodput (tokens/s), as judged then."""
    began_at: float | None = None
    """When the trial's apply returned (``started_at`` moves on a repeat or a confirming
    window): ``max_trial_s`` counts from here. None in a state from before it: from
    ``started_at``."""
    edge_from: float | None = None
    """Where that first window was measured from (it ended where the confirming one
    began, ``started_at``): measured again at the commit, whose evidence is both
    windows' figures, the worse P99s over all their requests."""
    rolling: bool = False
    """The trial's config is being rolled out (``DeploymentHandle.settled`` said
    ``Pending`` after its apply): no window is measured until the rollout completes, and
    ``started_at`` and ``began_at`` are then moved to that moment (``rollout_wait.py``).
    False in a state from before it: a trial judged as before."""
    draining: bool = False
    """The replicas the trial is measured on still work off the queue the config before
    it left (the overload an alert fired on): no window is measured until it has
    drained, and ``started_at`` and ``began_at`` are then moved to that moment
    (``backlog_wait.py``). False in a state from before it: measured from
    ``settle_s``."""
    backlog_first: float | None = None
    """The requests waiting at the wait's first reading (None: none read yet): how fast
    the queue falls is measured from it."""
    backlog_first_at: float | None = None
    """When that reading was made (the controller's clock)."""
    backlog_mark: float | None = None
    """The requests waiting at the start of the stretch the queue's fall is now read over
    (None: the first reading's): moved on every ``revert_after_s``, so a queue that fell
    fast and then levelled off far above steady is read as no longer falling."""
    backlog_mark_at: float | None = None
    """When that reading was made."""
    study: str | None = None
    """The study the trial was asked in (its name): a switch that ends it tells it failed
    there alone, as its number starts again in each study of the family. None in a
    state from before it: found by its number and config (``fail_left_trial``)."""


@dataclass
class PendingRestore:
    """A rollback whose apply failed: every replica is still owed the episode's config
    (``LoopState.rollback_config``), tried again once ``retry_at`` has passed
    (``restore.py``)."""

    since: float
    """When the first apply failed."""
    attempts: int
    """Applies that failed so far, the rollback's own included."""
    retry_at: float
    """No try before this (the controller's clock); the wait grows with ``attempts``."""
    error: str
    """Why the last apply failed, for the decisions."""
    trial: int | None = None
    """The trial whose config the replicas may still run (None: none was open)."""


@dataclass
class EndedTrial:
    """A trial the operator ended with no controller to judge it (none could be built for
    the CR: its study's storage unreadable, the spec or the operator's policy refusing
    it), or that a switch of its study's storage ended: its config taken off the pods,
    and told failed in its own study at the next build, never judged on a window that
    watched nothing (the operator's ``trial_ends.py``)."""

    number: int
    reason: str
    """Why it ended: its ``fail_reason`` in the study."""
    storage: str | None = None
    """The storage it was asked in, as the CR names it (the newest of
    ``status.studyStorages``); None: not known, the current one."""
    study: str | None = None
    """The study it was asked in (``RunningTrial.study``)."""
    config: dict[str, Any] | None = None
    """Its config: the trial of a study not named is found by number and config."""
    target: str | None = None
    """The backend and model it ran on (``LoopState.target``); None: the current ones."""


@dataclass
class RolloutWatch:
    """The loop's own look at the rollout under way (``rollout_watch.py``): when it last
    moved, and, for a commit's, the committed config it replaced."""

    since: float
    """When the rollout last went past its furthest (or the watch began: the return of
    the apply that began the rollout)."""
    generation: int | None = None
    """The template whose counts the next three are; None: none read yet."""
    updated: int = 0
    """The most of its replicas seen updated (``RolloutProgress.furthest``)."""
    old: int = 0
    """The fewest old replicas seen running."""
    available: int = 0
    """The most replicas seen available."""
    why: str | None = None
    """``Pending.why`` at the last look where the rollout had no counts to read."""
    config: dict[str, Any] | None = None
    """A commit's: the config committed (None: a trial's, a rollback's or a scale's)."""
    revert_to: dict[str, Any] | None = None
    """A commit's: the committed config before it, which the old pods still run; applied
    back when the commit's rollout is stuck (None: nothing to revert)."""


@dataclass
class StuckConfig:
    """A config whose rollout stuck: no trial runs it, nor warm start queues it, before
    ``until`` (``rollout_watch.py``)."""

    config: dict[str, Any]
    until: float
    why: str


@dataclass
class ReplicaWait:
    """A scale-up whose replicas the loop waits for (``scale_wait.py``)."""

    asked: int
    """The count the scale asked for: the wait ends once that many serve."""
    since: float
    """When the scale returned (the controller's clock): ``replica_ready_s`` counts
    from here."""


STRIKES_KEPT = 999
"""The most refusals in a row ``ReplicasShort.strikes`` counts (its hold stopped growing
at the fourth)."""


@dataclass
class ReplicasShort:
    """A scale-up to ``asked`` of which only ``ready`` served within ``replica_ready_s``:
    the others were given back, and before ``until`` no scale-up goes above what served
    (``scale_wait.py``)."""

    asked: int
    """The count the scale-up asked for (``asked - ready`` were refused)."""
    ready: int
    """How many served when the wait ended: the deployment was scaled back to this (or
    to ``min_replicas``), and no scale-up goes above it before ``until``."""
    since: float
    """When the wait ended."""
    why: str | None = None
    """What kept them, as the platform said (a quota refused, no node fits)."""
    until: float | None = None
    """When a scale-up is tried again (``since + hold_s``; the quota may have been
    raised). None in a state from before it, whose deployment still asks ``asked``: read
    as ``since + hold_s``. Kept past it, for ``strikes``, until more replicas serve."""
    strikes: int = 1
    """Refusals in a row with no more replicas serving than the one before: each doubles
    the hold (``scale_wait.hold_s``). 1 in a state from before it: the first strike."""

    def __post_init__(self) -> None:
        # Read from a status a tenant may write: a count past the hold's cap says only how
        # often, and one of thousands of digits was said in every message and write.
        self.strikes = min(self.strikes, STRIKES_KEPT)


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
    given_up_breach: dict[str, Any] | None = None
    """The largest count that breached live where the twin's capacity search gave up at
    or below it, with the situation (load, config, spec) it breached in: no scale-down
    to it or below while that situation holds (``given_up.py``). None: none kept (and in
    a state written before it)."""
    missed_trials: dict[str, Any] | None = None
    """The measured misses (``trials``) of episodes cut by the hour's trial budget with
    nothing held, added up while their situation (``situation``: count, load, config,
    spec) stays the same: at ``max_trials`` the commit buys a replica on them
    (``missed_trials.py``). None: none kept (and in a state written before it)."""
    pending_restore: PendingRestore | None = None
    """A rollback that could not be applied, retried until it lands; no episode starts
    meanwhile (``restore.py``). None: nothing owed (and in a state written before it)."""

    rollout: RolloutWatch | None = None
    """The rollout the loop waits for, as it last saw it (``rollout_watch.py``); None:
    none watched (and in a state written before it)."""
    stuck_configs: list[StuckConfig] = field(default_factory=list)
    """Configs whose rollouts stuck lately, held from trials and warm starts for
    ``max_backoff_s``: asked again at once, a commit that could not roll out was the
    study's best again and rolled the same stuck template."""
    replica_wait: ReplicaWait | None = None
    """A scale-up's replicas still awaited: COOLDOWN does not end before they serve or
    ``replica_ready_s`` passes (``scale_wait.py``). None: none (and in a state written
    before it)."""
    replicas_short: ReplicasShort | None = None
    """A scale-up's replicas that never served, given back: no scale-up above those that
    did before its ``until``, unless more serve meanwhile; kept past it for its strikes,
    which double the next hold (``scale_wait.py``)."""
    target: str | None = None
    """The backend and model (``builtin/<model>``) the loop's episode and trial run on, as
    the operator last built it: a switch since ends them (``rebase_episode``). None: a
    state written before it, taken as the current ones."""
    ended_trial: EndedTrial | None = None
    """A trial ended with no controller to judge it, or by a switch of the study's
    storage, still to be told failed in its own study: at the next build. None: none
    (and in a state written before it)."""

    def count_measured(self) -> None:
        """One more trial of the episode judged on a measured window."""
        self.episode_measured = (self.episode_measured or 0) + 1

    @property
    def episode_open(self) -> bool:
        """Whether a tuning episode is under way (TUNING, COMMIT)."""
        return self.state in (ControllerState.TUNING, ControllerState.COMMIT)

    @property
    def restore_owed(self) -> bool:
        """Whether the episode's configs are what the replicas must be put back on: an
        open episode, or one whose rollback failed and is still owed."""
        return self.episode_open or self.pending_restore is not None

    def rollback_config(self) -> dict[str, Any] | None:
        """What a rollback applies: the episode's best, else the config it began on.

        None outside an episode (unless its rollback is still owed, ``pending_restore``):
        nothing the loop applied is left to undo, and the last episode's configs are a
        record, not the deployment's config. Its commit became the deployment's own (in
        the operator, ``status.tunedConfig``, which belongs to the spec it was committed
        under), and a later edit of the spec may have left it behind: applied after the
        edit, it undid the edit. An owed rollback reads the record as it is when tried,
        so an edit meanwhile is honoured as during an episode (the operator's
        ``rebase_episode``).
        """
        if not self.restore_owed:
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
        data = _known_fields(cls, data, "")
        # Its texts one line each and bounded: they reach the log and events.
        values = {k: texts_read(v) for k, v in data.items()}
        # Written before the count was kept: not known, which is not "none measured".
        values.setdefault("episode_measured", None)
        try:
            values["state"] = ControllerState(values.get("state", "steady"))
        except (ValueError, TypeError):
            raise ControllerError(
                f"controller state: state={excerpt(data.get('state'))}; use one of: "
                f"{', '.join(s.value for s in ControllerState)}") from None
        nested = {"trial": RunningTrial, "pending_restore": PendingRestore,
                  "rollout": RolloutWatch, "replica_wait": ReplicaWait,
                  "replicas_short": ReplicasShort, "ended_trial": EndedTrial}
        check_fields(cls, values, "", skip=("state", "stuck_configs", *nested))
        for name, kind in nested.items():
            values[name] = _nested(kind, values, name)
        stuck = values.get("stuck_configs") or []
        if not isinstance(stuck, list):
            raise ControllerError(f"controller state: stuck_configs={excerpt(stuck)}: "
                                  "expected a list")
        held = [_nested(StuckConfig, {"stuck_configs": c}, "stuck_configs") for c in stuck]
        if None in held:
            raise ControllerError("controller state: stuck_configs holds a null; expected "
                                  "mappings of config, until and why")
        values["stuck_configs"] = held
        values["trial_starts"] = [float(t) for t in values.get("trial_starts") or []]
        return cls(**values)


def _nested(cls: type[Any], values: Mapping[str, Any], name: str) -> Any:
    """``values[name]`` read back as ``cls`` (None when absent or null); ControllerError
    naming the field for anything else."""
    saved = values.get(name)
    if saved is None:
        return None
    if not isinstance(saved, Mapping):
        raise ControllerError(f"controller state: {name}={excerpt(saved)}: expected a "
                              "mapping")
    saved = _known_fields(cls, saved, f"{name}.")
    check_fields(cls, saved, f"{name}.")
    try:
        return cls(**saved)
    except TypeError as exc:
        raise ControllerError(f"controller state: {name}={excerpt(saved)}: {exc}") from None


REMOVED_FIELDS: dict[type, dict[str, str]] = {
    RolloutWatch: {"progress": "the rollout's progress as one text, which builds of "
                               "2026-12-06 from 16de31b3 until a5dc8754 wrote before the "
                               "counts replaced it; the watch reads them at its next look"},
}
"""Fields a released slopilot wrote and a later one removed, per class, and why each is
safe to drop: an older operator's state on a CR (a CRD of its time keeps them) is
resumed without them, rather than refused with the controller stopped until someone
resets the state. A field not listed here nor declared is refused: a newer slopilot's
may carry meaning this one would silently lose."""


def _known_fields(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """``data`` without ``cls``'s removed fields (each dropped with a warning);
    ControllerError naming any other field ``cls`` does not declare."""
    removed = REMOVED_FIELDS.get(cls, {})
    unknown = sorted(k for k in data if k not in cls.__dataclass_fields__ and k not in removed)
    if unknown:
        raise ControllerError(
            f"controller state: unknown field(s) {[prefix + str(k) for k in unknown]}; was "
            "it written by a newer slopilot (or by an older one, with a field since "
            "removed)? Run the operator version that wrote it, or reset the state")
    dropped = sorted(k for k in data if k in removed)
    for name in dropped:
        log.warning("controller state: %s%s=%s ignored: a field this version no longer "
                    "keeps (%s)", prefix, name, excerpt(data[name]), removed[name])
    return {k: v for k, v in data.items() if k not in removed} if dropped else data
