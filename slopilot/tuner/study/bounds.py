"""The knobs the tuner may move and their bounds: the default ranges, and a deployment's
bounds parsed from user input and checked.

Defaults come from the knobs' own ranges in ``EngineConfig`` metadata, narrowed to
where a serving deployment plausibly wants them; a deployment fixes a knob or narrows
its range with ``SearchSpace.from_bounds`` (``space.py``): it writes ``[lo, hi]``,
``{lo, hi, log}``, a list of choices, or a single value (the knob is then fixed), which
``parse_bound`` turns into a checked bound.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from slopilot.engine.config import ConfigError, EngineConfig, PreemptionMode, coerce_knob


@dataclass(frozen=True, slots=True)
class IntRange:
    lo: int
    hi: int
    log: bool = False


@dataclass(frozen=True, slots=True)
class FloatRange:
    lo: float
    hi: float
    log: bool = False


@dataclass(frozen=True, slots=True)
class Choice:
    options: tuple[Any, ...]


Bound = IntRange | FloatRange | Choice

# The knobs the tuner moves, in the order they are suggested (budget before chunk).
TUNABLE: tuple[str, ...] = (
    "token_budget", "chunk_size", "max_num_seqs", "preemption_mode", "recompute_max_tokens",
    "max_preemptions_per_step", "swap_timeout_ms", "p0_preempt_utilization", "kv_watermark")

DEFAULT_BOUNDS: Mapping[str, Bound] = MappingProxyType({
    "token_budget": IntRange(128, 8192),
    "chunk_size": IntRange(64, 16384, log=True),  # capped by the budget per trial
    "max_num_seqs": IntRange(8, 1024, log=True),
    "preemption_mode": Choice(tuple(m.value for m in PreemptionMode)),
    "recompute_max_tokens": IntRange(64, 8192, log=True),
    "max_preemptions_per_step": IntRange(1, 16),
    "swap_timeout_ms": FloatRange(1.0, 1000.0, log=True),
    "p0_preempt_utilization": FloatRange(0.5, 1.0),
    "kv_watermark": FloatRange(0.0, 0.2),
})

FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}


class BoundError(ConfigError):
    """A malformed bound. ``problem`` is the message without its ``bounds.KNOB=...``
    start, so a caller names the bound as its user wrote it (``tune --bound``)."""

    def __init__(self, name: str, shown: str, problem: str) -> None:
        super().__init__(f"bounds.{name}{shown}: {problem}", name)
        self.problem = problem


def parse_bound(name: str, spec: Any, default: Bound) -> Bound | None:
    """A bound from user input; None means ``spec`` is a single value (the knob is fixed)."""
    if isinstance(spec, (IntRange, FloatRange, Choice)):
        bound: Bound = spec
    elif isinstance(default, Choice):
        if isinstance(spec, str | PreemptionMode):
            return None
        if not isinstance(spec, Sequence) or not spec:
            raise BoundError(name, f"={spec!r}", "expected one value or a non-empty list of: "
                             f"{', '.join(map(str, default.options))}")
        bound = Choice(tuple(str(coerce_knob(name, s).value) for s in spec))
    elif isinstance(spec, Mapping) or (isinstance(spec, Sequence) and not isinstance(spec, str)):
        if isinstance(spec, Mapping):
            unknown = set(spec) - {"lo", "hi", "min", "max", "log"}
            if unknown:
                raise BoundError(name, "", f"unknown field(s) {sorted(unknown)}; use lo and hi "
                                 "(or min and max)")
            lo, hi = spec.get("lo", spec.get("min")), spec.get("hi", spec.get("max"))
            log = bool(spec.get("log", getattr(default, "log", False)))
        else:
            if len(spec) != 2:
                raise BoundError(name, f"={list(spec)!r}", "expected two ends, lo and hi")
            lo, hi = spec
            log = getattr(default, "log", False)
        lo = default.lo if lo is None else lo
        hi = default.hi if hi is None else hi
        if isinstance(default, IntRange):
            lo, hi = coerce_knob(name, lo), coerce_knob(name, hi)
            if isinstance(lo, bool) or isinstance(hi, bool) or not isinstance(lo, int) \
                    or not isinstance(hi, int):
                raise BoundError(name, f"=[{lo!r}, {hi!r}]", "expected whole numbers")
            bound = IntRange(lo, hi, log)
        else:
            try:
                bound = FloatRange(float(lo), float(hi), log)
            except (TypeError, ValueError):
                raise BoundError(name, f"=[{lo!r}, {hi!r}]", "expected numbers") from None
    else:
        return None
    check_bound(name, bound)
    return bound


def check_bound(name: str, bound: Bound) -> None:
    meta = FIELDS[name].metadata
    if isinstance(bound, Choice):
        for option in bound.options:
            EngineConfig().with_overrides({name: option})  # names the allowed values
        if len(set(bound.options)) != len(bound.options):
            raise BoundError(name, f"={list(bound.options)!r}", "repeats a value")
        return
    lo, hi = meta["lo"], meta["hi"]
    if not (math.isfinite(bound.lo) and math.isfinite(bound.hi)):
        raise BoundError(name, f"=[{bound.lo}, {bound.hi}]", "expected finite numbers")
    if bound.lo > bound.hi:
        raise BoundError(name, f"=[{bound.lo}, {bound.hi}]", "lo is above hi; swap them")
    if bound.lo < lo or bound.hi > hi:
        raise BoundError(name, f"=[{bound.lo}, {bound.hi}]",
                         f"leaves the knob's range; use values in [{lo}, {hi}]")
    if bound.log and bound.lo <= 0:
        raise BoundError(name, "", f"a log scale needs lo > 0, got {bound.lo}")
