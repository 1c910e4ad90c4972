"""Which objects are whose: by controller reference and uid, never by name or label.

Anyone who can create an object in a namespace can give it any name and copy any label,
so neither says who made it. The controller reference does: a controller sets it with
``blockOwnerDeletion``, and it names its owner's uid, which a later object of the same
name does not share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference a controller set (controller and blockOwnerDeletion both true)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller") is True:
            return ref if ref.get("blockOwnerDeletion") is True else None
    return None


def controlled_by(obj: Mapping[str, Any] | None, kind: str, uid: str | None) -> bool:
    ref = controller_ref(obj) if obj is not None else None
    return bool(ref and uid and ref.get("kind") == kind and ref.get("uid") == uid)
