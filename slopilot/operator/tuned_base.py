"""Which spec a tuned config (``status.tunedConfig``) belongs to.

Three things it was tuned from, each recorded with it:

- ``spec.engine`` and ``spec.slo`` as the parse reads them: ``base``, a hash of the two
  sections with every member equal to the CRD's default taken out. The API server fills
  a new CRD's defaults into every CR (on read, and into etcd at the next write), so a
  hash of the raw JSON moved with a CRD upgrade that added one, and every CR fell back
  to its spec's knobs with nothing said. A member written as its default is the same
  spec as one left out, and hashes the same.
- ``backend`` and ``model`` (the model the engine loads: ``spec.model.path``, else its
  name): knobs tuned on the built-in engine, or for another model, are not vLLM's or
  this model's best. A record that names neither (written before they were recorded)
  belongs to the current ones.

The release of 2026-12-06 hashed the raw sections (``_hash`` of them as read): such a
record belongs where it matches the sections with any of the members that hold their
CRD default taken out, which are what a CRD upgrade since may have filled in (the
sections as read are one of those: nothing taken out).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from slopilot.tuner.study.study_target import StudyTarget

SECTIONS = ("engine", "slo")
BUILTIN = "builtin"
"""``spec.backend`` left out (the CRD's default, and the parse's)."""
MAX_LEGACY_DEFAULTS = 8
"""The defaulted members tried in every combination for a record in the old form (2^8
hashes at most, microseconds each); the CRD has 3 under these sections today."""

Path = tuple[str, ...]


@cache
def _section_schemas() -> dict[str, Mapping[str, Any]]:
    # crd.py builds its schema from knobs.py, which imports this: read when first asked.
    from slopilot.operator.crd import crd_manifest

    version = next(v for v in crd_manifest()["spec"]["versions"] if v.get("storage"))
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return {name: spec[name] for name in SECTIONS}


def _without_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """``value`` with each object member equal to its schema default left out, within."""
    if not isinstance(value, Mapping):
        return value
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key, member in value.items():
        sub = props.get(key)
        if sub is None:
            out[key] = member
            continue
        member = _without_defaults(sub, member)
        if "default" in sub and member == _without_defaults(sub, sub["default"]):
            continue
        out[key] = member
    return out


def _defaulted(schema: Mapping[str, Any], value: Any, at: Path = ()) -> Iterator[Path]:
    """The paths of the members of ``value`` that hold their schema default."""
    if not isinstance(value, Mapping):
        return
    props = schema.get("properties") or {}
    for key, member in value.items():
        if (sub := props.get(key)) is None:
            continue
        if "default" in sub and member == sub["default"]:
            yield (*at, key)
        else:
            yield from _defaulted(sub, member, (*at, key))


def _sections(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    return {name: spec.get(name) or {} for name in SECTIONS}


def _hash(sections: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()[:16]


def spec_checksum(body: Mapping[str, Any]) -> str:
    """``base`` for a config tuned from ``body``'s spec (module docstring)."""
    schemas = _section_schemas()
    return _hash({name: _without_defaults(schemas[name], value)
                  for name, value in _sections(body).items()})


def _removed(sections: Mapping[str, Any], paths: tuple[tuple[str, Path], ...]
             ) -> dict[str, Any]:
    out = copy.deepcopy(dict(sections))
    for name, path in paths:
        node = out[name]
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return out


def released_checksums(body: Mapping[str, Any]) -> Iterator[str]:
    """The old form's ``base`` of each way ``body``'s defaulted members may have come to
    be: the raw sections with every combination of them taken out."""
    schemas, sections = _section_schemas(), _sections(body)
    found = [(name, path) for name in SECTIONS
             for path in _defaulted(schemas[name], sections[name])]
    if len(found) > MAX_LEGACY_DEFAULTS:
        found = found[:MAX_LEGACY_DEFAULTS]
    for n in range(len(found) + 1):
        for chosen in itertools.combinations(found, n):
            yield _hash(_removed(sections, chosen))


def base_matches(base: Any, body: Mapping[str, Any]) -> bool:
    """Whether a record's ``base`` says it was tuned from ``body``'s sections."""
    if not isinstance(base, str):
        return False
    return base == spec_checksum(body) or base in released_checksums(body)


def target_of(body: Mapping[str, Any]) -> StudyTarget:
    """The backend and model ``body``'s spec runs (raw: knobs.py reads the CR before its
    parse): the model the engine loads, ``spec.model.path`` else its name."""
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    model = spec.get("model")
    model = model if isinstance(model, Mapping) else {}
    backend = spec.get("backend")
    ref = model.get("path") or model.get("name")
    return StudyTarget(backend if isinstance(backend, str) else BUILTIN,
                       ref if isinstance(ref, str) else "")


def recorded_target(tuned: Mapping[str, Any], current: StudyTarget) -> StudyTarget:
    """What a ``status.tunedConfig`` record says it was tuned on; what it leaves out, the
    ``current``."""
    backend, model = tuned.get("backend"), tuned.get("model")
    return StudyTarget(backend if isinstance(backend, str) else current.backend,
                       model if isinstance(model, str) else current.model)


def moved_from(tuned: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    """Why ``tuned`` (a record whose sections match) does not belong to ``body``'s
    backend or model, in words for the SpecWarning event; None where it does."""
    now = target_of(body)
    then = recorded_target(tuned, now)
    if then == now:
        return None
    what = []
    if then.backend != now.backend:
        what.append(f"backend {then.backend} (spec.backend is {now.backend} now)")
    if then.model != now.model:
        what.append(f"model {then.model!r} (spec.model is {now.model!r} now)")
    return (f"status.tunedConfig was tuned on {' and '.join(what)}: its knobs are not "
            "run, the spec's are, and tuning starts over for this one in a study of its "
            "own (the record is kept, a trial's as its committed knobs: switched back, "
            "they apply again)")
