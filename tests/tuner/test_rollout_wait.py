"""A config that reaches the replicas by a rollout (vLLM: new pods with new arguments) is
judged once the rollout has completed, on the new pods' figures; one that never
completes ends its trial ``rollout_stuck`` and is rolled back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.ports import Pending, Rollout, RolloutProgress, Settled, Stuck
from slopilot.tuner.loop.settings import ControllerSettings
from slopilot.tuner.loop.state import ControllerState as S
from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import (
    GOOD,
    SLO,
    START,
    FakeAlerts,
    FakeDeployment,
    FakeOffline,
    Rig,
    alert,
)

ROLL_S = 300.0
"""A new pod serves 5 min after the template changed (the model's download and load)."""


@dataclass
class RollingDeployment(FakeDeployment):
    """A vLLM-like deployment: an apply changes the template at once, and the old pods
    serve the old config until the new ones are ready ``roll_s`` later; a rollout past
    ``deadline_s`` is stuck (the Deployment's ProgressDeadlineExceeded)."""

    now: float = 0.0
    roll_s: float | None = ROLL_S
    """None: the new pods never become ready (no node has the GPUs)."""
    deadline_s: float = 900.0
    rolling: tuple[dict[str, Any], float] | None = None
    asked: list[tuple[float, str]] = field(default_factory=list)

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        self.applied.append((dict(config), False))  # no canary: every pod is rolled
        if not trial:
            self.committed = dict(config)
        self.rolling = (dict(config), self.now)

    def settled(self, now: float) -> Rollout:
        if self.rolling is None:
            state: Rollout = Settled()
        elif self.roll_s is not None and now >= self.rolling[1] + self.roll_s:
            self.config, self.rolling = self.rolling[0], None
            state = Settled()
        elif now >= self.rolling[1] + self.deadline_s:
            state = Stuck("ProgressDeadlineExceeded: ReplicaSet chat-2 has timed out "
                          "progressing")
        else:
            state = Pending("0 of 1 replicas updated")
        self.asked.append((now, type(state).__name__))
        return state

    def serving(self, canary: bool) -> dict[str, Any]:
        return self.config


def _rig(dep: RollingDeployment) -> Rig:
    return Rig(dep=dep, alerts=FakeAlerts([alert(AlertAction.RETUNE)]),
               offline=FakeOffline(), settings={"window_s": 120, "canary": False})


def run_rolling(rig: Rig, until: float, step: float = 30.0) -> list[tuple[float, Decision]]:
    """Tick ``rig``'s controller every ``step`` s to ``until``, its rolling deployment's
    clock moved with it: each tick's time and decision."""
    ctl = rig.ctl or rig.build()
    assert isinstance(rig.dep, RollingDeployment)
    out, t = [], 0.0
    while t <= until:
        rig.dep.now = t
        out.append((t, ctl.tick(t)))
        t += step
    return out


def test_the_warm_start_is_judged_on_its_own_pods_once_rolled_out() -> None:
    dep = RollingDeployment()
    rig = _rig(dep)
    ticks = run_rolling(rig, 600.0)
    # The GOOD warm start (trial 0) holds on its own figures: the old pods' START
    # misses P0, and judged on them the good config was told infeasible.
    assert 0 in rig.study.told and rig.study.told[0].feasible, rig.study.told
    assert rig.study.failed == {}
    assert dep.committed == GOOD
    # Nothing measured while the old pods served; the window starts once rolled out.
    assert rig.ev is not None and rig.ev.calls
    assert min(start for start, _, _ in rig.ev.calls) >= ROLL_S
    # While rolling out, the trial is pending: no other template was asked for.
    first_trials = [d for t, d in ticks if t < ROLL_S and d.action is Action.TRIAL]
    assert len(first_trials) == 1
    assert [c for c, _ in dep.applied[:1]] == [GOOD]
    waiting = [d for t, d in ticks if 0 < t < ROLL_S]
    assert waiting and all(d.state is S.TUNING and "rolling out" in d.reason
                           for d in waiting), [d.line() for d in waiting]


def test_a_rollout_that_never_completes_ends_the_trial_stuck_and_rolls_back() -> None:
    dep = RollingDeployment(roll_s=None)
    rig = _rig(dep)
    ticks = run_rolling(rig, 900.0)
    stuck = [d for _, d in ticks if "rollout_stuck" in d.reason]
    assert len(stuck) == 1, [d.line() for _, d in ticks]
    assert stuck[0].action is Action.REVERT and stuck[0].trial == 0
    assert "ProgressDeadlineExceeded" in stuck[0].reason
    assert "rollout_stuck" in rig.study.failed[0]
    assert 0 not in rig.study.told
    # Rolled back: the episode's starting config asked of every replica after it.
    assert (START, False) in dep.applied[1:]
    assert rig.ev is not None and rig.ev.calls == []  # nothing judged on the old pods


def test_a_rolling_trial_survives_a_restart() -> None:
    dep = RollingDeployment()
    rig = _rig(dep)
    run_rolling(rig, 60.0)
    assert rig.ctl is not None
    saved = LoopState.from_dict(rig.ctl.to_dict())
    assert saved.trial is not None and saved.trial.rolling
    rig.ctl = None
    rig.build(state=saved)
    run_rolling(rig, 600.0)
    assert rig.study.told[0].feasible and dep.committed == GOOD


def test_a_commit_is_not_cooled_down_before_its_rollout_completes() -> None:
    dep = RollingDeployment()
    rig = _rig(dep)
    rig.settings["cooldown_s"] = 30
    ticks = run_rolling(rig, 1500.0)
    commit_at = next(t for t, d in ticks if d.action is Action.COMMIT)
    steady_at = next(t for t, d in ticks if t > commit_at and d.state is S.STEADY)
    assert steady_at >= commit_at + ROLL_S, [(t, d.line()) for t, d in ticks]


@dataclass
class StuckCommit(RollingDeployment):
    """A rollout of ``stuck`` taken as committed (``trial=False``: the restore after the
    trial that held, and the commit) never completes, as when the namespace's quota lost
    its spare pod between the trial and the commit; every other rollout completes (a
    rollback to the old ReplicaSet, whose pods still serve, is quick)."""

    stuck: dict[str, Any] = field(default_factory=lambda: dict(GOOD))
    jammed: bool = False

    def apply_config(self, config: Mapping[str, Any], *, canary: bool,
                     trial: bool = False) -> None:
        super().apply_config(config, canary=canary, trial=trial)
        self.jammed = not trial and dict(config) == self.stuck

    def settled(self, now: float) -> Rollout:
        self.roll_s = None if self.jammed else ROLL_S
        return super().settled(now)


def test_a_commit_whose_rollout_sticks_is_reverted_to_the_previous_commit() -> None:
    dep = StuckCommit()
    rig = _rig(dep)
    ticks = run_rolling(rig, 4000.0)
    commit_at = next(t for t, d in ticks if d.action is Action.COMMIT)
    reverted = [(t, d) for t, d in ticks if "commit_reverted" in d.reason]
    assert len(reverted) == 1, [(t, d.line()) for t, d in ticks if t >= commit_at]
    at, d = reverted[0]
    assert d.action is Action.REVERT and d.state is S.COOLDOWN
    assert "rollout_stuck" in d.reason and "ProgressDeadlineExceeded" in d.reason
    assert d.config == START
    # The previous commit (the episode's start, which the old pods run) is what every
    # replica is asked for, and recorded as committed (status.tunedConfig).
    assert dep.committed == START
    # The stuck config is not proposed again at once: no later episode applies it.
    later = [c for c, _ in dep.applied[dep.applied.index((START, False)):]]
    assert GOOD not in later, later
    assert any(d.action is Action.TRIAL for t, d in ticks if t > at)
    assert not [d for t, d in ticks if t > at and "commit_reverted" in d.reason]


def test_a_rollout_the_controller_never_reports_ends_at_the_loops_bound() -> None:
    # No ProgressDeadlineExceeded ever comes (controller-manager down, the deadline
    # removed by another actor): Pending at every look, until the loop's own bound.
    dep = RollingDeployment(roll_s=None, deadline_s=float("inf"))
    rig = _rig(dep)
    rig.settings["rollout_timeout_s"] = 1200.0
    ticks = run_rolling(rig, 1500.0)
    stuck = [(t, d) for t, d in ticks if "rollout_stuck" in d.reason]
    assert len(stuck) == 1, [d.line() for _, d in ticks]
    at, d = stuck[0]
    assert 1200.0 <= at < 1200.0 + 30.0
    assert d.action is Action.REVERT and "controller never reported" in d.reason
    assert "rollout_timeout_s=1200" in d.reason
    assert "rollout_stuck" in rig.study.failed[0]
    assert (START, False) in dep.applied[1:]


@dataclass
class SlowRollout(RollingDeployment):
    """Three replicas, one more updated every ``step_s``: a rollout that takes longer
    than the loop's bound as a whole, but moves well within it."""

    step_s: float = 600.0

    def settled(self, now: float) -> Rollout:
        if self.rolling is None:
            return Settled()
        done = int((now - self.rolling[1]) // self.step_s)
        if done >= 3:
            self.config, self.rolling = self.rolling[0], None
            return Settled()
        return Pending(f"{done} of 3 replicas updated")


def test_a_rollout_that_moves_is_not_cut_by_the_loops_bound() -> None:
    dep = SlowRollout()
    rig = _rig(dep)
    rig.settings["rollout_timeout_s"] = 1200.0
    ticks = run_rolling(rig, 2400.0)
    assert not [d for _, d in ticks if "rollout_stuck" in d.reason], \
        [d.line() for _, d in ticks]
    assert rig.study.told[0].feasible


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), float("inf"), 30.0, True])
def test_a_bad_rollout_bound_is_refused_naming_field_value_and_fix(bad: Any) -> None:
    with pytest.raises(ControllerError) as err:
        ControllerSettings(deployment="demo", slo=SLO, rollout_timeout_s=bad)
    said = str(err.value)
    assert f"rollout_timeout_s={bad!r}" in said and "progressDeadlineSeconds" in said


def test_a_stuck_commits_revert_survives_a_restart_in_its_cooldown() -> None:
    dep = StuckCommit()
    rig = _rig(dep)
    ticks = run_rolling(rig, 600.0)
    assert any(d.action is Action.COMMIT for _, d in ticks)
    assert rig.ctl is not None
    saved = LoopState.from_dict(rig.ctl.to_dict())
    assert saved.rollout is not None and saved.rollout.revert_to == START
    rig.ctl = None
    ctl = rig.build(state=saved)
    later = []
    t = 630.0
    while t <= 2000.0:
        dep.now = t
        later.append(ctl.tick(t))
        t += 30.0
    assert [d for d in later if "commit_reverted" in d.reason]
    assert dep.committed == START
    kept = LoopState.from_dict(ctl.to_dict())
    assert [c.config for c in kept.stuck_configs] == [GOOD]


@pytest.mark.parametrize("bad", ["GOOD", [None], [{"config": {}, "until": "x", "why": ""}]])
def test_a_bad_stuck_config_record_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ControllerError, match="stuck_configs"):
        LoopState.from_dict({"stuck_configs": bad})


@dataclass
class CrashLoop(RollingDeployment):
    """A new pod that is ready a while, crashes, and is ready again: the counts go back
    and forth (as Kubernetes' own deadline counts "became available" as progress, it
    never says ProgressDeadlineExceeded either)."""

    period_s: float = 600.0

    def settled(self, now: float) -> Rollout:
        if self.rolling is None:
            return Settled()
        available = int(now // self.period_s) % 2 + 1
        return Pending(f"{available - 1} of 1 updated replicas available",
                       RolloutProgress(generation=2, updated=1, old=1,
                                       available=available))


def test_a_rollout_whose_counts_go_back_and_forth_is_bounded_all_the_same() -> None:
    """Reviewer's repro: a crash-looping new pod flipped the marker between 1 and 2
    available, each change restarted the bound, and after 6 hours the trial was still
    rolling out. Only a step past the best seen is progress."""
    dep = CrashLoop(roll_s=None, deadline_s=float("inf"))
    rig = _rig(dep)
    rig.settings["rollout_timeout_s"] = 1200.0
    ticks = run_rolling(rig, 3 * 3600.0, step=60.0)
    stuck = [(t, d) for t, d in ticks if "rollout_stuck" in d.reason]
    assert stuck, [d.line() for _, d in ticks[-3:]]
    # The best it reached (2 available, at 600 s) is its last progress: stuck 1200 s on.
    assert stuck[0][0] == pytest.approx(600.0 + 1200.0, abs=60.0), stuck[0][0]
    assert "controller never reported" in stuck[0][1].reason


def test_tuning_turned_off_forgets_a_commits_revert() -> None:
    """Reviewer's repro: a stuck commit's watch kept across tuning off and on reverted a
    later cooldown's deployment to the config before that commit, though it had rolled
    out fine since, and held the good config from trials."""
    dep = StuckCommit()
    rig = _rig(dep)
    ticks = run_rolling(rig, 600.0)
    assert any(d.action is Action.COMMIT for _, d in ticks)
    assert rig.ctl is not None and rig.ctl.loop.rollout is not None
    rig.ctl.stop(630.0, "tuning turned off")
    assert rig.ctl.loop.rollout is None
    assert LoopState.from_dict(rig.ctl.to_dict()).rollout is None


def test_a_held_config_is_matched_as_it_would_run() -> None:
    """Reviewer's repro: knobs compared where both name them held every config sharing
    one value with a stuck one. Both are laid over the config the episode began on."""
    from slopilot.tuner.loop.rollout_watch import held
    from slopilot.tuner.loop.state import StuckConfig
    loop = LoopState(baseline_config={"max_num_seqs": 128, "gpu_memory_utilization": 0.9})
    loop.stuck_configs = [StuckConfig({"max_num_seqs": 256, "gpu_memory_utilization": 0.97},
                                      until=100.0, why="stuck")]
    assert held(loop, 0.0, {"max_num_seqs": 256}) is None  # runs at 0.9: another config
    assert held(loop, 0.0, {"max_num_seqs": 256, "gpu_memory_utilization": 0.9}) is None
    assert held(loop, 0.0, {"max_num_seqs": 256, "gpu_memory_utilization": 0.97}) is not None
    assert held(loop, 100.0, {"max_num_seqs": 256, "gpu_memory_utilization": 0.97}) is None
    loop.baseline_config = {"max_num_seqs": 128, "gpu_memory_utilization": 0.97}
    assert held(loop, 0.0, {"max_num_seqs": 256}) is not None  # it would run as the stuck one
