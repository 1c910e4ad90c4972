"""One deployment's studies: its base study and the successors its space moved it to.

A study outlives releases. When today's space cannot go on in the base study (its
trials were run under other choices, kinds or ``log`` flags: ``space_fit.py``), the
deployment goes on in a successor, ``<base>/space-<fingerprint>``: named for the space's
shape, so every later open under the same space (a spec edit of a range's bounds, a
restarted operator) finds the same one, and the base is kept, untouched, as history.
Whoever deletes the deployment's study deletes the family (``delete_family``): the base
and each successor, matched by exact name, never a name that merely starts alike
(``ns/chat/uid`` is not ``ns/chat2/uid``'s, nor ``ns2/chat/uid``'s).

The common path (a compatible space) costs one read of the base study's trials, which
``open_study`` has just read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import optuna

from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.space_fit import (
    SpaceConflict,
    conflicts,
    fingerprint,
    space_distributions,
)
from slopilot.tuner.study.storage import delete_named_study, open_study, storage_of, study_names

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


@dataclass(frozen=True)
class SpaceMove:
    """The base study's trials were run under another space: the deployment goes on in
    ``successor``."""

    base: str
    successor: str
    conflicts: tuple[SpaceConflict, ...]
    made: bool
    """The successor was made by this open (the move is news), not found."""

    def message(self) -> str:
        return (f"the search space changed since the trials of study {self.base!r} "
                f"({'; '.join(c.describe() for c in self.conflicts)}), which Optuna "
                f"cannot go on in one study: tuning goes on in study {self.successor!r}, "
                "from no trials; the old one is kept, read-only, as history")


@dataclass(frozen=True)
class FamilyStudy:
    study: optuna.Study
    move: SpaceMove | None
    """None: the base study, as before."""


def open_for_space(storage: str | None, base: str, space: SearchSpace) -> FamilyStudy:
    """The study of ``base``'s family that ``space`` can be asked in: the base where its
    trials allow (the common path), else the space's successor, made where none is."""
    study = open_study(storage, base)
    now = space_distributions(space)
    found = conflicts(study.get_trials(deepcopy=False), now)
    if not found:
        return FamilyStudy(study, None)
    name = successor_name(base, fingerprint(now))
    store = storage_of(study)
    try:
        if store is not None:
            store.get_study_id_from_name(name)
        made = store is None
    except KeyError:
        made = True
    successor = open_study(storage, name)
    return FamilyStudy(successor, SpaceMove(base, name, tuple(found), made))


def delete_family(storage: str, base: str) -> list[str]:
    """Delete ``base`` and its successors from ``storage`` (a database URL); the names
    deleted. StudyStorageError where the storage cannot be reached."""
    return [name for name in study_names(storage)
            if in_family(base, name) and delete_named_study(storage, name)]
