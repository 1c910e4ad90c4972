"""``replacing``: a JSON merge patch (RFC 7386) that replaces a map whole.

Imports nothing of the operator's, so that the modules below ``crd.py`` (``knobs.py``)
build their status patches with it as the status writers do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def replacing(new: Mapping[str, Any], old: Any) -> dict[str, Any]:
    """``new`` as a merge patch that leaves ``new`` over ``old``: at every level, a key
    ``old``'s map holds and ``new``'s lacks is set null (RFC 7386 merges maps, so a
    field a writer dropped would otherwise stay)."""
    was = old if isinstance(old, Mapping) else {}
    return {**dict.fromkeys(k for k in was if k not in new),
            **{k: replacing(v, was.get(k)) if isinstance(v, Mapping) else v
               for k, v in new.items()}}
