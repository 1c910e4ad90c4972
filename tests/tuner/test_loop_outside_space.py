"""An episode's configs outside the search space it resumes in are not applied.

The operator builds a controller at every spec generation over the spec's space
(``spec.tuning.bounds``) and resumes the episode from ``status.controller``. Its running
trial and its best were drawn from the space before the edit (or written into the
status by hand, or by an older operator): narrowed mid-trial to keep the budget at
1024 or more, the trial at 512 still held and was committed to every replica, the new
bounds notwithstanding. Now a trial outside the space is told failed and reverted, and a
best outside it forgotten (the episode's baseline is its rollback target again).
"""

from __future__ import annotations

from typing import Any

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import (
    ControllerState,
    LoopState,
    PendingRestore,
    RunningTrial,
)
from slopilot.tuner.study.space import SearchSpace
from tests.tuner.controller_fakes import GOOD, START, FakeStudy, Rig

NARROWED = SearchSpace.from_bounds({"token_budget": [1024, 4096]})


def resumed(**state: Any) -> tuple[Rig, Any]:
    rig = Rig(study=FakeStudy(space=NARROWED))
    ctl = rig.build(LoopState(state=ControllerState.TUNING, baseline_config=dict(START),
                              **state))
    return rig, ctl


def test_a_trial_outside_the_narrowed_space_is_failed_and_never_committed() -> None:
    rig, ctl = resumed(trial=RunningTrial(number=3, config=dict(GOOD), started_at=0.0,
                                          canary=False))
    rig.dep.config = dict(GOOD)  # the trial runs on the pods
    d = ctl.tick(10.0)  # its window is over, and it would hold the SLO
    assert d.action is Action.REVERT and "outside the search space" in d.reason
    assert 3 in rig.study.failed and "token_budget=512" in rig.study.failed[3]
    assert 3 not in rig.study.told
    assert ctl.loop.best_config is None and ctl.loop.trial is None
    assert rig.dep.config == START  # the episode's starting config is back
    assert (dict(GOOD), False) not in rig.dep.applied[-1:]


def test_a_best_outside_the_narrowed_space_is_forgotten_not_rolled_back_to() -> None:
    _, ctl = resumed(best_config=dict(GOOD), best_goodput=150.0)
    assert ctl.loop.best_config is None and ctl.loop.best_goodput is None
    assert ctl.loop.rollback_config() == START


def test_a_best_inside_the_space_is_kept() -> None:
    inside = {"token_budget": 2048, "chunk_size": 512}
    _, ctl = resumed(best_config=dict(inside), best_goodput=150.0)
    assert ctl.loop.best_config == inside and ctl.loop.rollback_config() == inside


def test_outside_names_the_knob_and_the_bounds() -> None:
    assert NARROWED.outside({"token_budget": 2048, "chunk_size": 64}) is None
    why = NARROWED.outside({"token_budget": 512})
    assert why is not None and "token_budget=512" in why and "[1024, 4096]" in why
    assert NARROWED.outside({"preemption_mode": "sometimes"}) is not None
    assert NARROWED.outside({"token_budget": "lots"}) is not None
    fixed = SearchSpace.from_bounds({"token_budget": [1024, 4096], "max_num_seqs": 64})
    assert fixed.outside({"max_num_seqs": 128}) is not None


def test_an_owed_restore_to_a_best_outside_the_narrowed_space_restores_the_start() -> None:
    # The episode ended on a rollback that failed: its best is still the target, and
    # applied, it put every replica on a config the new bounds rule out.
    owed = PendingRestore(since=0.0, attempts=1, retry_at=0.0, error="RuntimeError: down")
    rig = Rig(study=FakeStudy(space=NARROWED))
    ctl = rig.build(LoopState(state=ControllerState.COOLDOWN, baseline_config=dict(START),
                              best_config=dict(GOOD), best_goodput=150.0,
                              pending_restore=owed))
    rig.dep.config = {"token_budget": 8192, "chunk_size": 8192}  # a trial's left behind
    d = ctl.tick(1.0)
    assert d.reason.startswith("restored:") and rig.dep.config == START
