"""A trial the loop fails on an error is told why by the error's cause too: Optuna's
``StorageInternalError`` says "invalid data in the commit, e.g. exceeding max length" of
a SQLite file another tenant's write held locked, which the driver's own line names."""

from __future__ import annotations

import sqlite3

from optuna.exceptions import StorageInternalError

from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.study.objective import TrialResult
from tests.tuner.controller_fakes import GOOD, START, FakeStudy, Rig


class LockedStudy(FakeStudy):
    def tell(self, number: int, result: TrialResult) -> None:
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as exc:
            raise StorageInternalError("An exception is raised during the commit. This "
                                       "typically happens due to invalid data in the "
                                       "commit, e.g. exceeding max length.") from exc


def test_a_trial_failed_on_a_locked_storage_is_told_the_lock() -> None:
    rig = Rig(study=LockedStudy())
    ctl = rig.build(LoopState(state=ControllerState.TUNING, baseline_config=dict(START),
                              trial=RunningTrial(number=3, config=dict(GOOD),
                                                 started_at=0.0, canary=False)))
    rig.dep.config = dict(GOOD)
    d = ctl.tick(10.0)  # its window is over: the tell fails on the lock
    assert d.action is Action.REVERT and "database is locked" in d.reason
    assert "database is locked" in rig.study.failed[3]
    assert rig.study.failed[3].startswith("error: StorageInternalError: ")
