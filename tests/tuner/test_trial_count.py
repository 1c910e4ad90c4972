"""The hour's live-trial cap across a crash (``trial_count.py``).

A trial's start reaches the loop's record (``LoopState.trial_starts``) only with the
status write after its tick; a process killed before then came back with no record of a
trial its pods ran. The start is stamped on the trial in the study before the apply, and
a new controller counts the study's stamps with its own record, neither twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.tuner.loop.state import LoopState
from slopilot.tuner.loop.trial_count import merged
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.study_family import successor_name
from slopilot.tuner.study.tuner import STARTED_ATTR
from tests.tuner.controller_fakes import FakeAlerts, Rig, alert


def test_a_start_both_hold_counts_once_and_each_ones_own_counts() -> None:
    assert merged([1.0, 2.0], [2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert merged([5.0, 5.0], [5.0]) == [5.0, 5.0]  # two trials at one virtual instant
    assert merged([5.0], [5.0, 5.0]) == [5.0, 5.0]
    assert merged([], []) == []


def tuner(url: str) -> ResumableTuner:
    return ResumableTuner(open_study(url, "live"), SearchSpace.from_bounds())


def rig(study: Any, **settings: Any) -> Rig:
    return Rig(alerts=FakeAlerts([alert(AlertAction.RETUNE)]), study=study, offline=None,
               settings={"max_trials_per_hour": 1, **settings})


def crashed_after_a_trial(url: str) -> tuple[Rig, dict[str, Any]]:
    """A loop that applied trial 0 at t=1000; returns it and the state its last status
    write kept (the one before that tick)."""
    first = rig(tuner(url))
    ctl = first.build()
    saved = ctl.to_dict()
    ctl.tick(1000.0)
    assert ctl.loop.trial is not None and len(first.dep.applied) == 1
    first.study.close()  # killed: the tick's state never written
    return first, saved


def test_a_loop_restarted_without_its_trials_record_counts_the_studys(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    again = rig(tuner(url))
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(1010.0)
    assert again.dep.applied == [] and ctl.loop.trial is None  # the hour's one has run
    assert ctl.loop.trial_starts == [1000.0]
    assert [t.number for t in optuna.load_study(study_name="live", storage=url).trials] \
        == [0]
    # An hour on the loop's clock after the start, it counts no more.
    ctl.tick(4600.0)
    assert ctl.loop.trial is not None and len(again.dep.applied) == 1
    again.study.close()


def test_a_start_on_record_and_in_the_study_counts_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    first = rig(tuner(url), max_trials_per_hour=2)
    ctl = first.build()
    ctl.tick(1000.0)
    saved = ctl.to_dict()  # written this time
    first.study.close()
    again = rig(tuner(url), max_trials_per_hour=2)
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(1001.0)
    assert ctl.loop.trial_starts == [1000.0]
    again.study.close()


def test_starts_of_another_study_count_beside_the_new_ones(tmp_path: Path) -> None:
    """A storage switch: the record holds the old study's starts, which the new study
    does not; its own unrecorded one is added to them."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    again = rig(tuner(url), max_trials_per_hour=3)
    state = LoopState.from_dict(saved)
    state.trial_starts = [900.0]  # a trial of the old storage's study
    ctl = again.build(state)
    ctl.tick(1010.0)
    assert ctl.loop.trial_starts[:2] == [900.0, 1000.0]
    again.study.close()


class Unreachable(ResumableTuner):
    """A study whose storage stops answering once ``down`` is set."""

    down = False

    def started_since(self, since: float) -> list[float]:
        if self.down:
            raise ConnectionError("could not connect to server: Connection refused")
        return super().started_since(since)


def test_a_study_out_of_reach_leaves_the_tick_and_is_read_before_the_next_trial(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    study = Unreachable(open_study(url, "live"), SearchSpace.from_bounds())
    study.down = True
    again = Rig(study=study, offline=None,  # type: ignore[arg-type]
                settings={"max_trials_per_hour": 1})
    ctl = again.build(LoopState.from_dict(saved))
    assert ctl.tick(1005.0).state.value == "steady"  # no alert: nothing needs the study
    assert ctl.tick(1006.0).state.value == "steady"
    assert caplog.text.count("trial starts not read") == 1  # said once
    assert ctl.loop.trial_starts == [] and not ctl.starts_recounted
    study.down = False
    again.alerts.alerts.append(alert(AlertAction.RETUNE))
    ctl.tick(1010.0)
    assert ctl.loop.trial_starts == [1000.0] and again.dep.applied == []
    study.close()


def test_a_stale_trials_measurement_kept_as_a_new_trial_is_no_new_start(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    first = tuner(url)
    number, config = first.ask()
    first.mark_started(number, 1000.0)
    first.close()
    study = optuna.load_study(study_name="live", storage=url)
    study.tell(number, state=optuna.trial.TrialState.FAIL)  # failed as stale
    from slopilot.tuner.study.objective import TrialResult
    again = tuner(url)
    again.tell(number, TrialResult(config=config, goodput_tok_s=1.0, constraints=(-0.5,),
                                   feasible=True, constraint_names=("p0_ttft",)))
    trials = optuna.load_study(study_name="live", storage=url).trials
    assert len(trials) == 2 and STARTED_ATTR not in trials[1].user_attrs
    assert again.started_since(0.0) == [1000.0]


def test_a_start_that_is_no_time_is_not_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    first = tuner(url)
    for value in ("soon", float("nan"), True, 1000.0):
        number, _ = first.ask()
        first._asked[number].set_user_attr(STARTED_ATTR, value)
        first.tell_failed(number, "test")
    assert first.started_since(0.0) == [1000.0]
    assert first.started_since(1000.5) == []


def test_a_forged_record_of_no_starts_does_not_lift_the_cap(tmp_path: Path) -> None:
    """A tenant who may write its status rewrote ``status.controller.trial_starts`` to
    ``[]`` at every step, each time a new controller was built from it (as the daemon
    does after another writer's state): 6 trials were asked in 97 s under a cap of 2 an
    hour. The study's stamps are counted by every new controller."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    study = tuner(url)
    forged = rig(study, max_trials_per_hour=2, max_trials=10)
    state: LoopState | None = None
    for now in (0.0, 10.0, 11.0, 21.0, 52.0, 54.0, 64.0, 65.0, 75.0, 76.0, 86.0, 97.0):
        ctl = forged.build(state)
        ctl.tick(now)
        state = LoopState.from_dict(dict(ctl.loop.to_dict(), trial_starts=[]))
    assert len(forged.dep.applied) <= 2 + 2, forged.dep.applied  # trials and restores
    trials = optuna.load_study(study_name="live", storage=url).trials
    assert len(trials) == 2 and all(STARTED_ATTR in t.user_attrs for t in trials)
    study.close()


def test_a_restart_in_a_successor_study_counts_the_old_studys_starts(
        tmp_path: Path) -> None:
    """The space changed while the operator was down: the restarted loop asks in the
    successor study (study_family.py), and the start the crash left unrecorded is in the
    base's stamps alone. Counted all the same: the cap is the deployment's, not one
    study's."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    successor = ResumableTuner(open_study(url, successor_name("live", "0123456789ab")),
                               SearchSpace.from_bounds())
    again = rig(successor)
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(1010.0)
    assert again.dep.applied == [] and ctl.loop.trial is None
    assert ctl.loop.trial_starts == [1000.0]
    successor.close()


def test_another_deployments_study_in_the_storage_is_not_counted(tmp_path: Path) -> None:
    """Only the study's own family: ``live2`` shares the database, not the cap."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    other = ResumableTuner(open_study(url, "live2"), SearchSpace.from_bounds())
    number, _ = other.ask()
    other.mark_started(number, 1000.0)
    other.close()
    again = rig(tuner(url))
    ctl = again.build()
    ctl.tick(1010.0)
    assert ctl.loop.trial is not None and ctl.loop.trial_starts == [1010.0]
    again.study.close()


def test_a_trial_a_crash_left_unrecorded_counts_in_its_episode(tmp_path: Path) -> None:
    """Trial 1 of a 2-trial episode applied, and the operator killed before its status
    write: the restarted loop's record says one trial ran. The study's stamp counts it in
    the episode too, which ends at its limit rather than asking a third."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    first = rig(tuner(url), max_trials_per_hour=10, max_trials=2)
    ctl = first.build()
    now = 1000.0
    ctl.tick(now)
    assert ctl.loop.trial is not None
    while ctl.loop.episode_trials < 1:  # trial 0 judged (it misses: the episode goes on)
        now += 5.0
        ctl.tick(now)
    assert ctl.loop.trial is None and ctl.loop.state.value == "tuning"
    saved = ctl.to_dict()  # written
    now += 1.0
    while ctl.loop.trial is None:
        ctl.tick(now)
    first.study.close()  # killed: trial 1's tick never written
    again = rig(tuner(url), max_trials_per_hour=10, max_trials=2)
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(now + 1.0)
    assert ctl.loop.episode_trials == 2 and ctl.loop.trial is None
    assert [t.number for t in optuna.load_study(study_name="live", storage=url).trials] \
        == [0, 1]  # no third trial asked
    again.study.close()


def test_an_unrecorded_start_before_a_new_episode_is_not_its_trial(tmp_path: Path) -> None:
    """The crash came in the tick that began the episode (the record is STEADY's): the
    restarted loop begins the episode anew, counting from 0, the start in its hour."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    again = rig(tuner(url), max_trials_per_hour=3)
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(1010.0)
    assert ctl.loop.episode_trials == 0 and ctl.loop.trial is not None
    assert ctl.loop.trial_starts == [1000.0, 1010.0]
    again.study.close()


def test_a_start_the_clock_stepped_back_over_counts_once_after_a_restart(
        tmp_path: Path) -> None:
    """Trial 0 started at 5000, then the clock stepped back to 2000: the record's start is
    brought back to 2000 (clock_step.py), the study's stamp stays 5000. A restart then
    finds one start in each under two values: one start, not two."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    first = rig(tuner(url), max_trials_per_hour=2)
    ctl = first.build()
    ctl.tick(5000.0)
    assert ctl.loop.trial is not None
    ctl.tick(2000.0)  # an NTP step back
    assert ctl.loop.trial_starts == [2000.0]
    saved = ctl.to_dict()  # written
    first.study.close()
    again = rig(tuner(url), max_trials_per_hour=2)
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(2005.0)
    assert ctl.loop.trial_starts == [2000.0]
    again.study.close()


def test_an_unrecorded_start_ahead_of_a_stepped_back_clock_still_counts(
        tmp_path: Path) -> None:
    """Killed before the write that recorded trial 0's start at 1000, restarted on a
    clock behind it: the study's stamp is the only record, and counts (from now)."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    _, saved = crashed_after_a_trial(url)
    again = rig(tuner(url))
    ctl = again.build(LoopState.from_dict(saved))
    ctl.tick(500.0)
    assert again.dep.applied == [] and ctl.loop.trial_starts == [500.0]
    again.study.close()


def test_a_stamp_ahead_of_the_clock_is_matched_with_an_entry_the_clock_moved() -> None:
    assert merged([2000.0], [5000.0], 2005.0) == [2000.0]
    assert merged([], [5000.0], 2005.0) == [5000.0]  # the record lacks it: counted
    assert merged([2000.0], [2000.0, 5000.0], 2005.0) == [2000.0, 5000.0]
    assert merged([2000.0], [5000.0]) == [2000.0, 5000.0]  # no clock: by value alone
