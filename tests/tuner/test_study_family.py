"""``space_fit``: which earlier trials today's space cannot go on beside (Optuna's rule);
``study_family``: the successor a space moves to, found again, and deleted with its base."""

from __future__ import annotations

from pathlib import Path

import optuna

from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.space_fit import conflicts, fingerprint, space_distributions
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.study_family import (
    base_of,
    delete_family,
    in_family,
    open_for_space,
    successor_name,
)


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
