"""Whose an object is, and the owner references the operator would write on it."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.ownership import claims, refs_to_write, with_owner

KIND, UID = "LLMDeployment", "uid-ours"
OURS = {"apiVersion": "slopilot.dev/v1alpha1", "kind": KIND, "name": "chat", "uid": UID,
        "controller": True, "blockOwnerDeletion": True}
ARGO = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "name": "apps",
        "uid": "uid-argo"}
BACKUP = {"apiVersion": "backup.io/v1", "kind": "Backup", "name": "nightly", "uid": "uid-b"}


def obj(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "chat", "ownerReferences": list(refs)}}


def test_a_missing_reference_of_its_own_is_appended_after_the_others() -> None:
    assert with_owner([ARGO, BACKUP], OURS) == [ARGO, BACKUP, OURS]
    assert refs_to_write(obj(ARGO, BACKUP), OURS) == [ARGO, BACKUP, OURS]
    assert refs_to_write({"metadata": {}}, OURS) == [OURS]


def test_its_own_reference_is_put_right_in_its_place() -> None:
    stale = {**OURS, "apiVersion": "slopilot.dev/v0", "controller": False}
    assert refs_to_write(obj(ARGO, stale, BACKUP), OURS) == [ARGO, OURS, BACKUP]


def test_nothing_is_written_where_its_own_is_right() -> None:
    assert refs_to_write(obj(ARGO, OURS, BACKUP), OURS) is None


@pytest.mark.parametrize(("refs", "mine"), [
    ((OURS, ARGO), True),
    (({**OURS, "controller": False}, ARGO), True),  # the mark taken off: put back
    (({k: v for k, v in OURS.items() if k != "blockOwnerDeletion"},), True),
    (({**OURS, "controller": False}, {**ARGO, "controller": True}), False),  # another's
    ((ARGO,), False),  # names the CR nowhere: a name anyone could take
    ((), False),
    (({**OURS, "uid": "uid-earlier"},), False),  # an earlier CR of the name
])
def test_claims(refs: tuple[dict[str, Any], ...], mine: bool) -> None:
    assert claims(obj(*refs), KIND, UID) is mine
    assert claims(obj(*refs), KIND, "") is False
