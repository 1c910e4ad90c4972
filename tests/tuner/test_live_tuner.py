"""ResumableTuner: a trial asked by an earlier controller is told in place."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from slopilot.tuner.loop.state import ControllerState, LoopState, RunningTrial
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study, storage_of
from slopilot.tuner.study.tuner import Tuner
from tests.tuner.controller_fakes import Rig


def test_a_restarted_controller_tells_the_running_trial_it_did_not_ask(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    space = SearchSpace.from_bounds()
    first = Tuner(open_study(url, "live"), space)
    number, config = first.ask()
    first.close()  # the process stops without telling; the trial stays RUNNING

    study = open_study(url, "live")
    assert storage_of(study) is not None
    again = ResumableTuner(study, space)
    again.tell(number, TrialResult(config=config, goodput_tok_s=12.5, constraints=(-0.5,),
                                   feasible=True, constraint_names=("p0_ttft",)))
    trials = optuna.load_study(study_name="live", storage=url).trials
    assert [(t.number, t.state) for t in trials] == [(number, TrialState.COMPLETE)]
    assert trials[0].value == 12.5 and trials[0].user_attrs["feasible"] is True


def test_a_restarted_controller_beats_for_the_trial_it_resumes(tmp_path: Path) -> None:
    """Only ``ask`` held a heartbeat: a trial resumed from the persisted state had none in
    the new process, so a window longer than the grace period failed it as stale, and its
    measurement became a second, completed trial."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    space = SearchSpace.from_bounds()
    first = Tuner(open_study(url, "live"), space)
    number, config = first.ask()
    first.close()  # the operator stops; the trial stays RUNNING
    again = ResumableTuner(open_study(url, "live"), space)
    rig = Rig(study=again)  # type: ignore[arg-type]
    ctl = rig.build(LoopState(state=ControllerState.TUNING, trial=RunningTrial(
        number, config, started_at=0.0, canary=False)))
    assert again.heartbeat is not None and again.heartbeat.beating == {number}
    ctl.tick(11.0)  # the window is over: told
    assert again.heartbeat.beating == set()
    trials = optuna.load_study(study_name="live", storage=url).trials
    assert [(t.number, t.state) for t in trials] == [(number, TrialState.COMPLETE)]
    again.close()


def test_a_finished_or_unknown_trial_is_not_resumed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    space = SearchSpace.from_bounds()
    first = Tuner(open_study(url, "live"), space)
    number, _ = first.ask()
    first.tell_failed(number, "engine crashed")
    first.close()
    again = ResumableTuner(open_study(url, "live"), space)
    again.resume(number)
    again.resume(number + 1)
    assert again.heartbeat is None
    again.tell_failed(number, "tuning was disabled")  # told already: nothing more
    assert optuna.load_study(study_name="live", storage=url).trials[0].user_attrs[
        "fail_reason"] == "engine crashed"


def test_a_trial_told_before_a_restart_is_not_told_twice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    space = SearchSpace.from_bounds()
    first = ResumableTuner(open_study(url, "live"), space)
    number, config = first.ask()
    result = TrialResult(config=config, goodput_tok_s=12.5, constraints=(-0.5,),
                         feasible=True, constraint_names=("p0_ttft",))
    first.tell(number, result)
    first.close()  # the status that said so was not written: the trial is told again
    again = ResumableTuner(open_study(url, "live"), space)
    again.tell(number, result)
    again.tell_failed(number, "tuning was disabled")
    trials = optuna.load_study(study_name="live", storage=url).trials
    assert [(t.number, t.state) for t in trials] == [(number, TrialState.COMPLETE)]


def test_a_study_not_opened_here_has_no_known_storage() -> None:
    assert storage_of(optuna.create_study()) is None


def test_a_resumed_study_seeded_at_the_limit_still_opens(tmp_path: Path) -> None:
    # A resumed study's sampler seed is offset by its trials so that a seeded sampler
    # does not repeat its first configs; at the 32-bit limit the offset passed it, and
    # `slopilot tune --seed 4294967295` failed on its second run with Optuna's error.
    from slopilot.tuner.study.storage import SEED_MAX

    url = f"sqlite:///{tmp_path / 'seeded.db'}"
    space = SearchSpace.from_bounds()
    first = Tuner(open_study(url, "s", sampler="random", seed=SEED_MAX), space)
    first_config = first.ask()[1]
    first.close()
    again = Tuner(open_study(url, "s", sampler="random", seed=SEED_MAX), space)
    # The offset wraps to seed 0 (one trial before): a sampler that is not the first's.
    assert again.ask()[1] != first_config
