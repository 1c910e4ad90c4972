"""What a caller of ``json_steps.loads`` keeps of a held event's value: some keys of an
object, the items or the count of an array, the value whole; the rest is parsed to know
it is JSON and dropped as it goes (``json_steps`` says why)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Keep:
    """What of a value is kept: an object's ``keys`` (each kept as it says, the others
    left out), an array's ``items`` (each kept as it says) or its ``count`` (that many
    ``None``), else the value whole. A value of another kind than its place says (an
    array where an object's keys are kept, a string) is kept whole."""

    keys: Mapping[str, Keep] | None = None
    items: Keep | None = None
    count: bool = False


WHOLE = Keep()
COUNT = Keep(count=True)


def project(value: Any, keep: Keep) -> Any:
    """What ``keep`` keeps of ``value`` (a ``json.loads`` one)."""
    if keep.keys is not None and isinstance(value, dict):
        return {k: project(v, keep.keys[k]) for k, v in value.items() if k in keep.keys}
    if isinstance(value, list):
        if keep.items is not None:
            return [project(v, keep.items) for v in value]
        if keep.count:
            return [None] * len(value)
    return value
