"""Which objects are whose: by controller reference and uid, never by name or label.

Anyone who can create an object in a namespace can give it any name and copy any label,
so neither says who made it. The controller reference does: a controller sets it with
``blockOwnerDeletion``, and it names its owner's uid, which a later object of the same
name does not share.

Other writers may add owner references of their own (Argo CD, a backup tool, a tenant):
those are theirs. The operator keeps each where it is and touches only its own, found by
uid as ``kopf.append_owner_reference`` finds it (``with_owner``). A merge patch replaces
a list whole, so the list is sent only where the operator's own reference needs putting
right, and then whole, every other reference in it: where the API server runs the
OwnerReferencesPermissionEnforcement admission plugin, any change to the list needs
``delete`` on the object, which the operator is not granted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def owner_refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((obj.get("metadata") or {}).get("ownerReferences") or ())


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference a controller set (controller and blockOwnerDeletion both true)."""
    for ref in owner_refs(obj):
        if ref.get("controller") is True:
            return ref if ref.get("blockOwnerDeletion") is True else None
    return None


def controlled_by(obj: Mapping[str, Any] | None, kind: str, uid: str | None) -> bool:
    ref = controller_ref(obj) if obj is not None else None
    return bool(ref and uid and ref.get("kind") == kind and ref.get("uid") == uid)


def names_owner(obj: Mapping[str, Any], kind: str, uid: str | None) -> bool:
    """Whether any owner reference of ``obj`` names the ``kind`` of that uid."""
    return bool(uid) and any(ref.get("kind") == kind and ref.get("uid") == uid
                             for ref in owner_refs(obj))


def other_controller(obj: Mapping[str, Any], uid: str | None) -> Mapping[str, Any] | None:
    """A reference that claims to be ``obj``'s controller and is not of ``uid``."""
    for ref in owner_refs(obj):
        if ref.get("controller") is True and ref.get("uid") != uid:
            return ref
    return None


def claims(obj: Mapping[str, Any] | None, kind: str, uid: str | None) -> bool:
    """Whether ``obj`` is the ``kind`` of ``uid``'s to manage: its controller reference
    names that uid, or a reference does and none other claims to be the controller (its
    ``controller`` or ``blockOwnerDeletion`` was taken off, which the reconcile puts
    back). Only someone who may write the object can put the uid there, so this reads
    no more into it than ``controlled_by`` does; an object that names the uid nowhere is
    never claimed, whatever its name or labels."""
    if obj is None or not uid:
        return False
    if controlled_by(obj, kind, uid):
        return True
    return names_owner(obj, kind, uid) and other_controller(obj, uid) is None


def with_owner(refs: Sequence[Mapping[str, Any]], ours: Mapping[str, Any]
               ) -> list[dict[str, Any]]:
    """``refs`` with ``ours`` in place of the reference of its uid (appended where none
    is), every other kept as it is and where it is."""
    out = [dict(ours) if ref.get("uid") == ours.get("uid") else dict(ref) for ref in refs]
    if not any(ref.get("uid") == ours.get("uid") for ref in refs):
        out.append(dict(ours))
    return out


def refs_to_write(live: Mapping[str, Any], ours: Mapping[str, Any]
                  ) -> list[dict[str, Any]] | None:
    """The whole ownerReferences list to send so that ``live`` carries ``ours`` as it
    should, others kept; None where it already does (send no list at all then)."""
    have = owner_refs(live)
    for ref in have:
        if ref.get("uid") == ours.get("uid"):
            # Fields the API server may add to a reference are not ours to judge.
            if all(ref.get(k) == v for k, v in ours.items()):
                return None
            break
    return with_owner(have, ours)
