"""The stamp each scale leaves on the Deployment, so that a restart does not scale twice.

A tick's scale patches the Deployment, then its status write records the tick (the loop
in COOLDOWN). Where that write failed and the operator stopped before writing it again,
the restarted loop resumed the state from before the scale with the alert still firing,
and the target, the count it read plus one (a scale on live evidence, or past what the
offline study finds), was one more than the lost tick's: 1 -> 2, then 2 -> 3.

So each scale's patch also writes ``slopilot.dev/scale`` on the Deployment, in the same
request: the loop state on record that the tick began from (a digest of
``status.controller`` as ``loop_status.on_record`` reads it), the count before and the
count asked. A loop whose state on record is that one (nothing recorded since the
scale) reads the count from before it (``KubeDeploymentHandle.replicas``): its tick is
the lost one made again, and its scale to the same count a no-op that it records, then
cools down. Only while the Deployment still asks the stamped count: scaled since by
someone else, the loop reads what it finds. Only until the handle's own scale (its
count is the Deployment's again) or the next write of ``status.controller`` (another
state on record).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

SCALE_ANNOTATION = "slopilot.dev/scale"


@dataclass(frozen=True)
class ScaleStamp:
    """One scale as the Deployment carries it."""

    over: str
    """The digest of the loop state on record that the scaling tick began from."""
    before: int
    """The count that state knew (the Deployment's before the scale, or the stamp's
    before where the scale was the lost one made again)."""
    to: int
    """The count the scale asked."""

    def annotation(self) -> dict[str, str]:
        return {SCALE_ANNOTATION: json.dumps(
            {"over": self.over, "before": self.before, "to": self.to},
            sort_keys=True, separators=(",", ":"))}


def record_digest(record: Any) -> str:
    """A digest of ``status.controller`` as on record; alike for the state written and
    the state read back (the API server keeps no trailing ``.0``: 1000.0 comes back as
    1000)."""
    text = json.dumps(_canonical(record), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read_stamp(deployment: Mapping[str, Any]) -> ScaleStamp | None:
    """The Deployment's stamp; None where it has none, or one the operator did not write
    (an annotation is anyone's with patch rights on the Deployment to write)."""
    raw = ((deployment.get("metadata") or {}).get("annotations") or {}).get(
        SCALE_ANNOTATION)
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if not isinstance(data, Mapping):
        return None
    over, before, to = data.get("over"), data.get("before"), data.get("to")
    if not (isinstance(over, str) and _count(before) and _count(to)):
        return None
    return ScaleStamp(over, before, to)


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
