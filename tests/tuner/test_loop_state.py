"""The controller's saved state is read back only as the types it was written with.

``status.controller`` lives in the LLMDeployment's status: whoever may write the status
(or an older operator, or a hand edit) can put anything there, and a restarted operator
resumes from it. A value of the wrong type must stop the controller with a message that
names the field, not escape as a TypeError from deep inside a tick.
"""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.tuner.loop.errors import ControllerError
from slopilot.tuner.loop.state import (
    ControllerState,
    LoopState,
    PendingRestore,
    RolloutWatch,
    RunningTrial,
)

TRIAL = {"number": 3, "config": {"token_budget": 512}, "started_at": 10.0, "canary": True}
OWED = {"since": 5.0, "attempts": 2, "retry_at": 10.0, "error": "RuntimeError: down",
        "trial": 3}


def test_a_saved_state_round_trips() -> None:
    state = LoopState(state=ControllerState.TUNING, since=5.0, trial=RunningTrial(**TRIAL),
                      trial_starts=[1.0, 2], best_goodput=3, twin={"trusted": True})
    assert LoopState.from_dict(state.to_dict()) == state


def test_the_trials_study_round_trips_and_an_older_state_names_none() -> None:
    state = LoopState(trial=RunningTrial(**TRIAL, study="ns/chat/uid/space-0123456789ab"))
    assert LoopState.from_dict(state.to_dict()) == state
    assert LoopState.from_dict({"trial": TRIAL}).trial == RunningTrial(**TRIAL)  # before it
    assert RunningTrial(**TRIAL).study is None


def test_an_owed_restore_round_trips_and_an_older_state_owes_none() -> None:
    state = LoopState(state=ControllerState.COOLDOWN, pending_restore=PendingRestore(**OWED))
    assert LoopState.from_dict(state.to_dict()) == state
    older = state.to_dict()
    del older["pending_restore"]  # written before the field
    assert LoopState.from_dict(older).pending_restore is None


@pytest.mark.parametrize(("saved", "field"), [
    ({"trial_starts": ["x"]}, "trial_starts"),
    ({"trial_starts": 5}, "trial_starts"),
    ({"since": "yesterday"}, "since"),
    ({"since": float("nan")}, "since"),
    ({"since": True}, "since"),
    ({"reason": 7}, "reason"),
    ({"episode_trials": 1.5}, "episode_trials"),
    ({"episode_trials": "3"}, "episode_trials"),
    ({"best_config": [1, 2]}, "best_config"),
    ({"best_goodput": "lots"}, "best_goodput"),
    ({"prometheus_unavailable": "no"}, "prometheus_unavailable"),
    ({"cooldown_until": float("inf")}, "cooldown_until"),
    ({"twin": "trusted"}, "twin"),
    ({"trial": "running"}, "trial"),
    ({"trial": {**TRIAL, "number": "3"}}, "trial.number"),
    ({"trial": {**TRIAL, "config": None}}, "trial.config"),
    ({"trial": {**TRIAL, "canary_replica": 5}}, "trial.canary_replica"),
    ({"trial": {**TRIAL, "study": 7}}, "trial.study"),
    ({"trial": {"number": 3}}, "trial"),
    ({"pending_restore": "owed"}, "pending_restore"),
    ({"pending_restore": {**OWED, "attempts": "2"}}, "pending_restore.attempts"),
    ({"pending_restore": {**OWED, "retry_at": None}}, "pending_restore.retry_at"),
    ({"pending_restore": {**OWED, "error": 5}}, "pending_restore.error"),
    ({"pending_restore": {"since": 5.0}}, "pending_restore"),
])
def test_a_field_of_the_wrong_type_is_named(saved: dict[str, Any], field: str) -> None:
    with pytest.raises(ControllerError, match=rf"controller state: {field}="):
        LoopState.from_dict(saved)


def test_a_long_bad_value_is_cut_in_the_message() -> None:
    with pytest.raises(ControllerError) as info:
        LoopState.from_dict({"reason": ["x" * 10_000]})
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("state", list(ControllerState))
def test_only_an_open_episode_has_a_config_to_roll_back_to(state: ControllerState) -> None:
    # Outside an episode its configs are the last one's record: its commit is the
    # deployment's own config, which a later edit of the spec may have replaced.
    start, best = {"token_budget": 2048}, {"token_budget": 512}
    loop = LoopState(state=state, baseline_config=start, best_config=best)
    is_open = state in (ControllerState.TUNING, ControllerState.COMMIT)
    assert loop.episode_open is is_open
    assert loop.rollback_config() == (best if is_open else None)
    loop.best_config = None
    assert loop.rollback_config() == (start if is_open else None)


@pytest.mark.parametrize("state", list(ControllerState))
def test_an_owed_restore_keeps_the_episodes_config_to_roll_back_to(
        state: ControllerState) -> None:
    # Its rollback failed: the episode ended, but its replicas are still owed its config.
    start, best = {"token_budget": 2048}, {"token_budget": 512}
    loop = LoopState(state=state, baseline_config=start, best_config=best,
                     pending_restore=PendingRestore(**OWED))
    assert loop.rollback_config() == best
    loop.best_config = None
    assert loop.rollback_config() == start


@pytest.mark.parametrize(("saved", "field"), [
    # A count below zero let the episode run past max_trials (-1000: 1020 trials) and a
    # trial's window be rejected past max_window_repeats; a time below zero is no clock
    # reading (a trial that started in 1938 was measured over 88 years of Prometheus).
    ({"episode_trials": -1000}, "episode_trials"),
    ({"episode_feasible": -1}, "episode_feasible"),
    ({"episode_warm_starts": -3}, "episode_warm_starts"),
    ({"trial": {**TRIAL, "repeats": -1000}}, "trial.repeats"),
    ({"trial": {**TRIAL, "number": -1}}, "trial.number"),
    ({"trial": {**TRIAL, "started_at": -1e9}}, "trial.started_at"),
    ({"since": -5.0}, "since"),
    ({"cooldown_until": -1.0}, "cooldown_until"),
    ({"trial_starts": [1.0, -2.0]}, "trial_starts"),
    ({"best_goodput": -10.0}, "best_goodput"),
    ({"pending_restore": {**OWED, "attempts": -1}}, "pending_restore.attempts"),
    ({"pending_restore": {**OWED, "retry_at": -1.0}}, "pending_restore.retry_at"),
])
def test_a_value_below_zero_is_named(saved: dict[str, Any], field: str) -> None:
    with pytest.raises(ControllerError, match=rf"controller state: {field}=.*>= 0"):
        LoopState.from_dict(saved)


def test_a_confirming_windows_constraints_may_be_below_zero() -> None:
    # A constraint below zero is a term that held: the one value that may be negative.
    trial = {**TRIAL, "edge_constraints": [-0.1, 0.02], "edge_goodput": 12.0}
    assert LoopState.from_dict({"trial": trial}).trial == RunningTrial(**trial)


def test_a_list_of_strings_of_the_wrong_type_is_named_as_such() -> None:
    with pytest.raises(ControllerError) as info:
        LoopState.from_dict({"episode_classes": [1]})
    assert "expected a list of strings" in str(info.value)


def test_a_saved_states_texts_are_read_back_one_line_and_bounded() -> None:
    """The state's free texts (an owed restore's error, a stuck config's why, the scale's
    reason) go into the decision's reason, the operator's log and a Warning event; the
    status they live in is anyone's with status rights to write. A forged error of a
    newline and 200 kB wrote its own line into the shared operator log, claiming to be
    about another tenant, and a 200 kB line. Read back, a text is one line (control
    characters escaped) and at most ``MAX_STATE_TEXT`` characters; the operator's own
    texts read back as written."""
    from slopilot.tuner.loop.state_fields import MAX_STATE_TEXT

    forged = "x\n[2026-12-07 17:00:00,000] kopf.objects [WARNING] [team-b/chat] FORGED: " \
        + "y" * 200_000
    state = LoopState.from_dict({
        "state": "steady", "scale_reason": "a\rb\x1b[31mc\u2028d",
        "pending_restore": {"since": 1.0, "attempts": 0, "retry_at": 1.0, "error": forged},
        "stuck_configs": [{"config": {"chunk_size": 256}, "until": 5.0, "why": "z\n" * 3}]})
    assert state.pending_restore is not None
    error = state.pending_restore.error
    assert "\n" not in error and len(error) <= MAX_STATE_TEXT
    assert error.startswith("x\\n[2026-12-07 17:00:00,000] kopf.objects")
    assert state.scale_reason == "a\\rb\\x1b[31mc\\u2028d"
    assert state.stuck_configs[0].why == "z\\n" * 3
    own = LoopState.from_dict({"state": "steady", "reason": "trial 3 holds: P0 TTFT 1.2 s"})
    assert own.reason == "trial 3 holds: P0 TTFT 1.2 s"


WATCH = {"since": 10.0, "updated": 1, "config": {"token_budget": 512}}


@pytest.mark.parametrize("saved, named", [
    ({"rollout": {**WATCH, "phase": "surge"}}, "rollout.phase"),
    ({"trial": {**TRIAL, "verdict": "kept"}}, "trial.verdict"),
    ({"stuck_configs": [{"config": {}, "until": 5.0, "why": "x", "tries": 2}]},
     "stuck_configs.tries"),
    ({"flavour": 1}, "flavour"),
])
def test_an_unknown_field_at_any_depth_is_named_with_the_version_hint(
        saved: dict[str, Any], named: str) -> None:
    """An unknown nested field said as an unknown top-level one is, not as the raw
    TypeError of the dataclass (``__init__() got an unexpected keyword argument``)."""
    with pytest.raises(ControllerError) as caught:
        LoopState.from_dict(saved)
    message = str(caught.value)
    assert named in message and "newer" in message and "older" in message
    assert "unexpected keyword" not in message


def test_a_field_an_older_slopilot_wrote_and_this_one_removed_is_ignored(
        caplog: pytest.LogCaptureFixture) -> None:
    """``RolloutWatch.progress`` was written by the builds of 2026-12-06 from 16de31b3
    until a5dc8754 while they watched a rollout: a state it left mid-rollout is resumed, the field
    dropped with a warning, rather than refused with the controller stopped."""
    with caplog.at_level("WARNING", logger="slopilot.tuner.loop.state"):
        state = LoopState.from_dict({"rollout": {**WATCH, "progress": "1/1 updated"}})
    assert state.rollout == RolloutWatch(**WATCH)
    assert any("rollout.progress" in r.getMessage() for r in caplog.records)
