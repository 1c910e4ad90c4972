"""``space_fit``: which earlier trials today's space cannot go on beside (Optuna's rule);
``study_family``: the successor a space moves to, found again, and deleted with its base."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.space_fit import conflicts, fingerprint, space_distributions
from slopilot.tuner.study.storage import StudyStorageError, open_study
from slopilot.tuner.study.study_family import (
    LeftTrial,
    base_of,
    delete_family,
    fail_left_trial,
    in_family,
    open_for_space,
    successor_name,
    told_failed,
)
from slopilot.tuner.study.study_target import StudyTarget

# Trials asked here as the loop asks them (outside Study.optimize), on the heartbeat
# storage the daemon uses: Optuna's note on that is not news (tuner.py hides it too).
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


def asked(storage: str, name: str, space: SearchSpace) -> None:
    tuner = ResumableTuner(open_study(storage, name), space)
    number, _ = tuner.ask()
    tuner.tell_failed(number, "done")
    tuner.close()


def test_a_range_moved_is_no_conflict_and_keeps_the_fingerprint(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    asked(storage, "a", SearchSpace.from_bounds({}))
    moved = SearchSpace.from_bounds({"max_num_seqs": {"min": 16, "max": 256},
                                     "max_preemptions_per_step": {"min": 2, "max": 8}})
    study = open_study(storage, "a")
    assert conflicts(study.trials, space_distributions(moved)) == []
    assert fingerprint(space_distributions(moved)) == \
        fingerprint(space_distributions(SearchSpace.from_bounds({})))
    found = open_for_space(storage, "a", moved)
    assert found.move is None and found.study.study_name == "a"


def test_other_choices_a_log_flip_and_a_kind_change_each_conflict() -> None:
    old = SearchSpace.from_bounds({"preemption_mode": ["recompute", "swap"],
                                   "max_preemptions_per_step": {"lo": 1, "hi": 16,
                                                                "log": True}})
    trial = optuna.trial.create_trial(
        params={"kv_watermark": 1}, distributions={
            "kv_watermark": optuna.distributions.IntDistribution(0, 2)}, value=1.0)
    recorded = optuna.trial.create_trial(
        params={"preemption_mode": "swap", "max_preemptions_per_step": 4},
        distributions={k: v for k, v in space_distributions(old).items()
                       if k in ("preemption_mode", "max_preemptions_per_step")}, value=1.0)
    now = space_distributions(SearchSpace.from_bounds({}))
    found = {c.param: c.describe() for c in conflicts([trial, recorded], now)}
    assert found == {
        "preemption_mode": "preemption_mode: choices (recompute, swap) then, "
                           "(recompute, swap, auto) now",
        "max_preemptions_per_step": "max_preemptions_per_step: log-scaled then, linear now",
        "kv_watermark": "kv_watermark: integer, linear then, real, linear now"}
    assert fingerprint(now) != fingerprint(space_distributions(old))


def test_the_family_is_matched_by_exact_name() -> None:
    base = "team/chat/u1"
    successor = successor_name(base, "0123456789ab")
    assert in_family(base, base) and in_family(base, successor)
    assert base_of(successor) == base and base_of(base) == base
    for other in ("team/chat2/u1", "team/chat/u12", "team-b/chat/u1", "team/chat",
                  "team/chat/u1/space-", "team/chat/u1/space-0123456789abc",
                  "team/chat/u1/space-0123456789ab/x", "team/chat2/u1/space-0123456789ab",
                  "x/team/chat/u1/space-0123456789ab"):
        assert not in_family(base, other), other


def test_delete_family_deletes_the_base_and_its_successors_only(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    names = ["team/chat/u1", successor_name("team/chat/u1", "0123456789ab"),
             successor_name("team/chat/u1", "ba9876543210"), "team/chat2/u2",
             successor_name("team/chat2/u2", "0123456789ab"), "team-b/chat/u3",
             "team/chat/u1-offline"]
    for name in names:
        open_study(storage, name)
    assert sorted(delete_family(storage, "team/chat/u1")) == sorted(names[:3])
    assert sorted(optuna.get_all_study_names(storage)) == sorted(names[3:])


def told(study: optuna.Study, space: SearchSpace, *values: float) -> None:
    """Trials of ``space`` with ``values``, asked and told as the loop's sampler would."""
    dists = space_distributions(space)
    for value in values:
        study.tell(study.ask(dists), value)


def test_a_backend_switch_goes_on_in_a_study_of_its_own_and_back(tmp_path: Path) -> None:
    """vLLM's space is a subset of the built-in engine's, which Optuna would take in one
    study: its sampler then learned from the other engine's trials."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    builtin, vllm = StudyTarget("builtin", "smollm2-135m"), StudyTarget("vllm", "smollm2-135m")
    full = SearchSpace.from_bounds({})
    subset = SearchSpace.from_bounds({}, applies=frozenset(
        {"token_budget", "chunk_size", "max_num_seqs"}))
    assert conflicts([], space_distributions(subset)) == []
    first = open_for_space(storage, "ns/chat/u1", full, builtin)
    assert first.move is None
    told(first.study, full, 50.0, 80.0)
    moved = open_for_space(storage, "ns/chat/u1", subset, vllm)
    assert moved.move is not None and moved.move.made
    assert moved.study.study_name == moved.move.successor != "ns/chat/u1"
    assert in_family("ns/chat/u1", moved.study.study_name)
    assert moved.study.trials == []
    assert "backend builtin" in moved.move.message() and "backend vllm" in moved.move.message()
    told(moved.study, subset, 60.0)
    again = open_for_space(storage, "ns/chat/u1", subset, vllm)
    assert again.move is not None and not again.move.made
    assert again.study.study_name == moved.study.study_name and len(again.study.trials) == 1
    back = open_for_space(storage, "ns/chat/u1", full, builtin)
    assert back.move is None and [t.value for t in back.study.trials] == [50.0, 80.0]
    other_model = open_for_space(storage, "ns/chat/u1", full,
                                 StudyTarget("builtin", "tiny-random"))
    assert other_model.move is not None and other_model.study.trials == []
    assert len(delete_family(storage, "ns/chat/u1")) == 3


def test_a_study_made_before_targets_were_recorded_is_the_current_targets(
        tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace.from_bounds({})
    told(open_study(storage, "ns/chat/u1"), space, 50.0)
    found = open_for_space(storage, "ns/chat/u1", space, StudyTarget("vllm", "m"))
    assert found.move is None and len(found.study.trials) == 1
    assert StudyTarget.recorded(open_study(storage, "ns/chat/u1").user_attrs) == \
        StudyTarget("vllm", "m")


def test_a_study_made_before_targets_were_recorded_takes_the_stamps_target(
        tmp_path: Path) -> None:
    """Made before the upgrade, its trials run on the built-in engine (as the committed
    config's stamp says), and the spec switched to vLLM since: the study is the built-in
    engine's, and vLLM goes on in a successor of its own."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace.from_bounds({})
    builtin, vllm = StudyTarget("builtin", "m"), StudyTarget("vllm", "m")
    told(open_study(storage, "ns/chat/u1"), space, 50.0)
    found = open_for_space(storage, "ns/chat/u1", space, vllm, unrecorded=builtin)
    assert found.move is not None and found.move.target_then == builtin
    assert found.study.study_name != "ns/chat/u1" and found.study.trials == []
    assert StudyTarget.recorded(open_study(storage, "ns/chat/u1").user_attrs) == builtin
    # Recorded now: what a later caller takes the study to be no longer counts.
    back = open_for_space(storage, "ns/chat/u1", space, builtin, unrecorded=vllm)
    assert back.move is None and [t.value for t in back.study.trials] == [50.0]
    # A study with no trials yet (a storage moved since, say) is the current target's.
    fresh = open_for_space(storage, "ns/chat/u2", space, vllm, unrecorded=builtin)
    assert fresh.move is None and fresh.study.study_name == "ns/chat/u2"


def test_a_trial_a_switch_left_running_is_told_failed_in_its_own_study(
        tmp_path: Path) -> None:
    """The built-in engine's trial 0 runs when the spec switches to vLLM: it is failed in
    the built-in engine's study, with the switch as its reason, and vLLM's own running
    trial 0 is left alone."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace.from_bounds({})
    builtin, vllm = StudyTarget("builtin", "m"), StudyTarget("vllm", "m")
    left = ResumableTuner(open_for_space(storage, "ns/chat/u1", space, builtin).study, space)
    number, _ = left.ask()
    moved = open_for_space(storage, "ns/chat/u1", space, vllm)
    other = ResumableTuner(moved.study, space)
    assert other.ask()[0] == number
    why = "engine_switched: builtin/m -> vllm/m"
    left_trial = LeftTrial(number, "ns/chat/u1")
    assert fail_left_trial(storage, "ns/chat/u1", builtin, left_trial, why) == "ns/chat/u1"
    failed = open_study(storage, "ns/chat/u1").trials[number]
    assert failed.state is optuna.trial.TrialState.FAIL
    assert failed.user_attrs["fail_reason"] == why
    assert open_study(storage, moved.study.study_name).trials[number].state \
        is optuna.trial.TrialState.RUNNING
    # Told once: a second build after the switch finds none running.
    assert fail_left_trial(storage, "ns/chat/u1", builtin, left_trial, why) is None
    left.close()
    other.close()


def test_a_trial_a_switch_left_in_a_space_moves_successor_is_told_failed_there(
        tmp_path: Path) -> None:
    """A space move's successor records no target: its trials ran on its base's."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    old = SearchSpace.from_bounds({"max_preemptions_per_step": {"lo": 1, "hi": 16,
                                                                "log": True}})
    now = SearchSpace.from_bounds({})
    builtin, vllm = StudyTarget("builtin", "m"), StudyTarget("vllm", "m")
    told(open_for_space(storage, "ns/chat/u1", old, builtin).study, old, 50.0)
    moved = open_for_space(storage, "ns/chat/u1", now, builtin)
    assert moved.move is not None and moved.move.target_then is None
    left = ResumableTuner(moved.study, now)
    number, _ = left.ask()
    left_trial = LeftTrial(number, moved.study.study_name)
    assert fail_left_trial(storage, "ns/chat/u1", vllm, left_trial, "x") is None
    assert fail_left_trial(storage, "ns/chat/u1", builtin, left_trial, "switched") == \
        moved.study.study_name
    assert open_study(storage, moved.study.study_name).trials[number].state \
        is optuna.trial.TrialState.FAIL
    left.close()


FAMILY = ["ns/chat/u1", "ns/chat2/u1", "ns2/chat/u1", "ns/chat/u1x",
          successor_name("ns/chat/u1", "a" * 12),
          successor_name(successor_name("ns/chat/u1", "a" * 12), "b" * 12)]
"""A base, names that merely start alike, a space move's successor (which records no
target: its base's), and a successor's successor (no member of the family)."""


def running_zeros(storage: str, target: StudyTarget) -> dict[str, int]:
    """Trial 0 running in each of ``FAMILY``, asked as ``Tuner`` asks it (its config a
    user attribute): its ``max_num_seqs``, told apart by the study's place in the list."""
    seqs: dict[str, int] = {}
    for i, name in enumerate(FAMILY):
        study = open_study(storage, name)
        if name == "ns/chat/u1" or "/space-" not in name:
            target.record(study)
        trial = study.ask()
        trial.set_user_attr("config", {"max_num_seqs": 8 + i})
        seqs[name] = 8 + i
    return seqs


def states(storage: str) -> dict[str, list[str]]:
    return {name: [t.state.name for t in optuna.load_study(
        study_name=name, storage=storage).trials] for name in FAMILY}


def test_the_left_trial_is_failed_in_the_study_it_was_asked_in_alone(
        tmp_path: Path) -> None:
    """Trial numbers start again in each study of the family: the successor's trial 0
    was the switch's, and a second build before the status said so (the same call
    again) failed the base's own running trial 0, the switch its reason."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    vllm = StudyTarget("vllm", "m")
    running_zeros(storage, vllm)
    successor = FAMILY[4]
    left_trial = LeftTrial(0, successor)
    for _ in range(2):
        fail_left_trial(storage, "ns/chat/u1", vllm, left_trial, "switch")
    assert states(storage) == {name: ["FAIL" if name == successor else "RUNNING"]
                               for name in FAMILY}


def test_a_state_that_names_no_study_fails_the_one_trial_of_its_config(
        tmp_path: Path) -> None:
    """A loop state from before the study was recorded: the trial whose number and
    config are the state's, where exactly one study of the target runs one, and only
    once; never the base's trial 0 of another config."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    vllm = StudyTarget("vllm", "m")
    seqs = running_zeros(storage, vllm)
    successor = FAMILY[4]
    left_trial = LeftTrial(0, None, {"max_num_seqs": seqs[successor]})
    assert fail_left_trial(storage, "ns/chat/u1", vllm, left_trial, "switch") == successor
    assert fail_left_trial(storage, "ns/chat/u1", vllm, left_trial, "switch") is None
    assert states(storage) == {name: ["FAIL" if name == successor else "RUNNING"]
                               for name in FAMILY}


def test_a_state_that_names_no_study_or_config_fails_none_of_two_candidates(
        tmp_path: Path) -> None:
    """Number alone, with the base and its successor both running a trial 0: which was
    the switch's is not known, and neither is failed (the switch's goes stale)."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    vllm = StudyTarget("vllm", "m")
    running_zeros(storage, vllm)
    assert fail_left_trial(storage, "ns/chat/u1", vllm, LeftTrial(0), "switch") is None
    assert all(s == ["RUNNING"] for s in states(storage).values())


def stale_running(storage: str, db: Path, name: str, number_of_trials: int) -> int:
    """``name`` with trials 0.. told failed with a reason (``done``), the last left
    RUNNING with its last heartbeat in 2000: stale, and no opener has failed it yet. Its
    number."""
    tuner = ResumableTuner(open_study(storage, name), SearchSpace.from_bounds({}))
    for _ in range(number_of_trials - 1):
        tuner.tell_failed(tuner.ask()[0], "done")
    number, _ = tuner.ask()
    tuner.close()  # its heartbeat stops; the trial stays RUNNING
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE trial_heartbeats SET heartbeat = '2000-01-01 00:00:00'")
    return number


def test_told_failed_reads_one_trial_and_fails_no_stale_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's question is a few lookups of the one trial: it loads no study's
    trials (a study of hundreds, at each unverified stamp) and, no opener of the study,
    fails none of its stale trials as a side effect (that is the loop's to do, and its
    ``fail_reason``-less FAIL is not this question's business)."""
    db = tmp_path / "s.db"
    storage = f"sqlite:///{db}"
    running = stale_running(storage, db, "ns/chat/u1", 30)
    built: list[int] = []  # a FrozenTrial per trial the storage loads
    init = optuna.trial.FrozenTrial.__init__

    def counted(self: optuna.trial.FrozenTrial, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(optuna.trial.FrozenTrial, "__init__", counted)
    assert told_failed(storage, "ns/chat/u1", 3) == "done"
    assert told_failed(storage, "ns/chat/u1", running) is None
    assert told_failed(storage, "ns/chat/u1", running + 1) is None  # not there
    assert told_failed(storage, "ns/chat/u2", 0) is None  # no such study
    assert told_failed(f"sqlite:///{tmp_path / 'none.db'}", "ns/chat/u1", 0) is None
    assert not (tmp_path / "none.db").exists()  # not created for the question
    assert len(built) <= 2  # the two trials there, one each
    with sqlite3.connect(db) as conn:
        (state,), = conn.execute("SELECT state FROM trials WHERE number = ?", (running,))
    assert state == "RUNNING"


def test_told_failed_in_an_unreachable_storage_is_a_storage_error() -> None:
    with pytest.raises(StudyStorageError, match=r"u:\*\*\*@127\.0\.0\.1:1") as raised:
        told_failed("postgresql://u:secret@127.0.0.1:1/db", "a", 0)
    assert "secret" not in str(raised.value)
