"""One deployment's studies: its base study and the successors its space moved it to.

A study outlives releases. When today's space cannot go on in the base study (its
trials were run under other choices, kinds or ``log`` flags: ``space_fit.py``), the
deployment goes on in a successor, ``<base>/space-<fingerprint>``: named for the space's
shape, so every later open under the same space (a spec edit of a range's bounds, a
restarted operator) finds the same one, and the base is kept, untouched, as history.
The same goes for what the trials were run on (``StudyTarget``: the backend and the
model): a switch goes on in ``<base>/space-<fingerprint>`` of the space and the target
both, whose trials were run on the same (a vLLM space is a subset of the built-in
engine's, and Optuna would take it in the base study, the sampler learning from trials
of another engine), and a switch back goes on where it left off. A study made before
its target was recorded (the attribute absent) was run on what its caller says its
trials ran on (``unrecorded``: the operator reads the loop state's or the committed
config's stamp), else on the current target. A trial a switch left running in the study
of the target it ran on is told failed there (``fail_left_trial``), the switch its
reason, rather than left to go stale.
Whoever deletes the deployment's study deletes the family (``delete_family``): the base
and each successor, matched by exact name, never a name that merely starts alike
(``ns/chat/uid`` is not ``ns/chat2/uid``'s, nor ``ns2/chat/uid``'s).

The common path (a compatible space) costs one read of the base study's trials, which
``open_study`` has just read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.space_fit import (
    SpaceConflict,
    conflicts,
    fingerprint,
    space_distributions,
)
from slopilot.tuner.study.storage import (
    delete_named_study,
    open_study,
    storage_of,
    stored_trial,
    study_names,
)
from slopilot.tuner.study.study_target import StudyTarget

SUCCESSOR_MARK = "/space-"
_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


def successor_name(base: str, space_fingerprint: str) -> str:
    return f"{base}{SUCCESSOR_MARK}{space_fingerprint}"


def in_family(base: str, name: str) -> bool:
    """Whether ``name`` is ``base`` or one of its successors."""
    if name == base:
        return True
    head, mark, tail = name.rpartition(SUCCESSOR_MARK)
    return bool(mark) and head == base and _FINGERPRINT.fullmatch(tail) is not None


def base_of(name: str) -> str:
    """The base study of ``name`` (itself, where it is no successor)."""
    head, mark, tail = name.rpartition(SUCCESSOR_MARK)
    return head if mark and _FINGERPRINT.fullmatch(tail) else name


def target_fingerprint(space_fingerprint: str, target: StudyTarget) -> str:
    """12 hex digits of a space's fingerprint and a target: a successor's name part."""
    text = f"{space_fingerprint}\0{target.backend}\0{target.model}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class SpaceMove:
    """The base study's trials were run under another space, or on another target: the
    deployment goes on in ``successor``."""

    base: str
    successor: str
    conflicts: tuple[SpaceConflict, ...]
    made: bool
    """The successor was made by this open (the move is news), not found."""
    target_then: StudyTarget | None = None
    """Where the base's trials were run on another target: that one (``target_now``
    the deployment's); None for a move of the space."""
    target_now: StudyTarget | None = None

    def message(self) -> str:
        if self.target_then is not None and self.target_now is not None:
            return (f"the trials of study {self.base!r} were run on "
                    f"{self.target_then.describe()}; the deployment runs on "
                    f"{self.target_now.describe()} now, whose best knobs they do not "
                    f"tell: tuning goes on in study {self.successor!r}, with the trials "
                    "run on that alone (none where it is new); the old study is kept, "
                    "and goes on again if the deployment switches back")
        return (f"the search space changed since the trials of study {self.base!r} "
                f"({'; '.join(c.describe() for c in self.conflicts)}), which Optuna "
                f"cannot go on in one study: tuning goes on in study {self.successor!r}, "
                "from no trials; the old one is kept, read-only, as history")


@dataclass(frozen=True)
class FamilyStudy:
    study: optuna.Study
    move: SpaceMove | None
    """None: the base study, as before."""


def open_for_space(storage: str | None, base: str, space: SearchSpace,
                   target: StudyTarget | None = None, *,
                   unrecorded: StudyTarget | None = None) -> FamilyStudy:
    """The study of ``base``'s family that ``space`` can be asked in, on ``target``: the
    base where its trials allow (the common path), else the successor of the space (and
    of the target, where the base's trials were run on another), made where none is.
    None: the target is not judged (``slopilot tune``'s own studies). ``unrecorded``:
    what the base's trials ran on where it holds some and records no target (made before
    targets were recorded; None: ``target``)."""
    study = open_study(storage, base)
    now = space_distributions(space)
    if target is not None:
        then = StudyTarget.recorded(study.user_attrs)
        if then is None:
            # Made before targets were recorded: taken as the current one, a study of
            # the built-in engine's trials went on as vLLM's after a switch. One with no
            # trials (just made) is the current target's whatever ran before.
            then = unrecorded if unrecorded is not None \
                and study.get_trials(deepcopy=False) else target
            then.record(study)
        if then != target:
            name = successor_name(base, target_fingerprint(fingerprint(now), target))
            successor, made = _successor(storage, study, name)
            if made or StudyTarget.recorded(successor.user_attrs) is None:
                target.record(successor)
            return FamilyStudy(successor, SpaceMove(base, name, (), made, then, target))
    found = conflicts(study.get_trials(deepcopy=False), now)
    if not found:
        return FamilyStudy(study, None)
    name = successor_name(base, fingerprint(now))
    successor, made = _successor(storage, study, name)
    return FamilyStudy(successor, SpaceMove(base, name, tuple(found), made))


def _successor(storage: str | None, base: optuna.Study, name: str
               ) -> tuple[optuna.Study, bool]:
    """Study ``name`` in ``base``'s storage, and whether this open made it."""
    store = storage_of(base)
    try:
        if store is not None:
            store.get_study_id_from_name(name)
        made = store is None
    except KeyError:
        made = True
    return open_study(storage, name), made


@dataclass(frozen=True)
class LeftTrial:
    """The trial a switch ended, as the loop state saved it: enough to find it alone in
    the family, whose studies each number their trials from 0."""

    number: int
    study: str | None = None
    """The study it was asked in (``RunningTrial.study``); None in a state saved before
    it was kept."""
    config: Mapping[str, Any] | None = None
    """Its config as the loop ran it, which the trial's ``config`` attribute holds (the
    ask's); None: not known. Read only where ``study`` is None."""


def fail_left_trial(storage: str, base: str, target: StudyTarget, left: LeftTrial,
                    reason: str) -> str | None:
    """Trial ``left``, which a switch away from ``target`` left running in the family's
    study of ``target``, told failed there with ``reason`` (its ``fail_reason``); the
    study's name, or None where it no longer runs (told already, or failed as stale) or
    is not known for sure. Left running, it went stale a grace period later with no
    reason but a missed heartbeat. Where ``left`` names its study, that study's trial
    alone (trial numbers start again in each study: a second build before the status
    said so failed the base's own running trial of the number). A state from before the
    study was kept names none: a study of ``target`` (one that records it, or a successor
    a space move made that records none, of a base that does) whose running trial of the
    number has the state's config, where there is exactly one; of several, none (the
    trial goes stale). StudyStorageError where the storage cannot be reached."""
    names = [name for name in study_names(storage) if in_family(base, name)
             and (left.study is None or name in (left.study, base))]
    studies = {name: open_study(storage, name) for name in names}
    base_target = StudyTarget.recorded(studies[base].user_attrs) if base in studies else None
    found = [study for name, study in studies.items()
             if (left.study is None or name == left.study)
             and (StudyTarget.recorded(study.user_attrs)
                  or (base_target if name != base else None)) == target
             and _running(study, left)]
    return _fail(found[0], left, reason) if len(found) == 1 else None


def told_failed(storage: str, name: str, number: int) -> str | None:
    """The ``fail_reason`` of trial ``number`` of study ``name`` where it was told
    failed with one (an end the operator gave it); None where it runs, completed, was
    failed as stale (no reason), or is not there. Lookups of the one trial
    (``stored_trial``): no trial of the study loaded, none failed as stale by the
    question. StudyStorageError where the storage cannot be reached."""
    trial = stored_trial(storage, name, number)
    if trial is None or trial.state is not TrialState.FAIL:
        return None
    reason = trial.user_attrs.get("fail_reason")
    return reason if isinstance(reason, str) else None


def _running(study: optuna.Study, left: LeftTrial) -> bool:
    """Whether ``study`` runs trial ``left`` (its number; and its config where the
    study is not named)."""
    return any(t.number == left.number and (
        left.study is not None or left.config is None
        or t.user_attrs.get("config") == dict(left.config))
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def _fail(study: optuna.Study, left: LeftTrial, reason: str) -> str | None:
    store = storage_of(study)
    if store is None:
        return None
    study_id = store.get_study_id_from_name(study.study_name)
    trial_id = store.get_trial_id_from_study_id_trial_number(study_id, left.number)
    optuna.Trial(study, trial_id).set_user_attr("fail_reason", reason)
    study.tell(left.number, state=TrialState.FAIL)
    return study.study_name


def family_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials of ``study``'s family in its storage: its base's and each successor's,
    ``study``'s own among them (only its own where its storage is not known). What one
    deployment ran, whichever space asked it: a start stamped in the base before a
    restart under a changed space moved the deployment to a successor still counts in
    its hourly cap (``Tuner.started_since``)."""
    store = storage_of(study)
    if store is None:
        return list(study.get_trials(deepcopy=False))
    base = base_of(study.study_name)
    out: list[optuna.trial.FrozenTrial] = []
    for name in optuna.get_all_study_names(storage=store):
        if in_family(base, name):
            out.extend(store.get_all_trials(store.get_study_id_from_name(name),
                                            deepcopy=False))
    return out


def delete_family(storage: str, base: str) -> list[str]:
    """Delete ``base`` and its successors from ``storage`` (a database URL); the names
    deleted. StudyStorageError where the storage cannot be reached."""
    return [name for name in study_names(storage)
            if in_family(base, name) and delete_named_study(storage, name)]
