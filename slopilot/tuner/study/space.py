"""The search space: which knobs the tuner moves, within which bounds, on which grid.

A deployment's bounds (``bounds.py``: the default ranges, their parsing) become a space
with ``SearchSpace.from_bounds``. Two knobs are encoded, not sampled raw:

- ``token_budget`` is its multiple of ``budget_align``, a parameter named for the
  alignment (``token_budget/256``: 4 is 1024): the engine rounds the budget up to that
  tile anyway, so values between grid points are the same config and one value is one
  config. Sampled log-uniformly: an iteration's time, and so TBT, scales with the budget,
  so 256 -> 512 matters as much as 4096 -> 8192 and small budgets must not be starved.
  A value means one budget whatever the bounds: a study outlives its bounds (the
  operator rebuilds its tuner over the same study at each spec edit, with its queued
  warm starts and its history), and the rank on the bounds' grid this replaced made
  every stored value mean another budget after an edit. Another alignment is another
  parameter, whose values no trial of the old one is read as;
- ``chunk_size`` is a fraction, in log space, of ``[chunk lo, min(chunk hi, budget)]``:
  the chunk can never exceed the budget, and a fraction keeps one fixed distribution
  for Optuna, where a range that moves with the budget would not.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from slopilot.engine.config import ConfigError, EngineConfig, PreemptionMode, coerce_knob
from slopilot.tuner.study.bounds import (
    DEFAULT_BOUNDS,
    FIELDS,
    TUNABLE,
    Bound,
    Choice,
    FloatRange,
    IntRange,
    parse_bound,
)

CHUNK_PARAM = "chunk_fraction"
LEGACY_BUDGET_PARAM = "token_budget_rank"
"""The budget's parameter before ``budget_param``: its rank on the bounds' grid, which an
edit of the bounds changed the meaning of. Never read as a budget."""


def budget_param(align: int) -> str:
    """The Optuna parameter of a budget on the ``align``-token grid: its multiple of it."""
    return f"token_budget/{align}"


def user_name(param: str) -> str:
    """The knob an Optuna parameter of the space stands for (its encodings named as the
    knobs they encode)."""
    if param == LEGACY_BUDGET_PARAM or param.startswith("token_budget/"):
        return "token_budget"
    return "chunk_size" if param == CHUNK_PARAM else param


class TrialLike(Protocol):
    """The part of ``optuna.Trial`` that ``suggest`` uses (define-by-run)."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int: ...
    def suggest_float(self, name: str, low: float, high: float, *,
                      step: float | None = None, log: bool = False) -> float: ...
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


@dataclass(frozen=True)
class SearchSpace:
    """Bounds of the tuned knobs plus the values held fixed; build with ``from_bounds``."""

    bounds: Mapping[str, Bound]
    fixed: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    budget_align: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "bounds", MappingProxyType(dict(self.bounds)))
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))
        if "budget_align" in self.fixed and self.fixed["budget_align"] != self.budget_align:
            raise ConfigError("budget_align is given twice with different values")
        for name in self.bounds:
            if name not in TUNABLE:
                raise ConfigError(f"{name!r} cannot be tuned; tunable knobs: "
                                  f"{', '.join(TUNABLE)}")
            if name in self.fixed:
                raise ConfigError(f"{name} is both fixed and tuned; give one or the other")
        # Names, types and ranges of the fixed values (the budget and chunk as placeholders
        # when tuned, so a fixed chunk is checked against a fixed budget only).
        EngineConfig().with_overrides({
            **self.fixed, "budget_align": self.budget_align,
            "token_budget": self.fixed.get("token_budget", 16384),
            "chunk_size": self.fixed.get("chunk_size", 64)})
        if not self.budget_grid():
            raise ConfigError(self._empty_budget_message())
        if not self.bounds:
            raise ConfigError("every knob is fixed: nothing to tune; leave at least one "
                              "knob unfixed")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_bounds(cls, bounds: Mapping[str, Any] | None = None, *,
                    base: EngineConfig | None = None,
                    applies: Collection[str] | None = None) -> SearchSpace:
        """The default space with a deployment's changes: the one function ``slopilot
        tune``, the demo and the operator build their spaces with.

        ``bounds`` maps a knob to ``[lo, hi]`` (or ``{lo, hi, log}``, either end left to
        the default) to narrow or widen it, to a list of choices (``preemption_mode``), or
        to a single value to fix it. Knobs the tuner never moves (``block_size``,
        ``budget_align`` ...) may only be fixed; they default to ``base`` (the engine
        defaults if None). ``applies``: the knobs the backend applies (None: all, the
        built-in engine); the space leaves the others out, neither tuned nor fixed, so no
        trial varies a knob the engines would ignore.
        """
        base = base or EngineConfig()
        ranges: dict[str, Bound] = {n: b for n, b in DEFAULT_BOUNDS.items()
                                    if applies is None or n in applies}
        fixed: dict[str, Any] = {}
        for name, spec in (bounds or {}).items():
            if name not in FIELDS:
                raise ConfigError(f"unknown knob {name!r}; known knobs: "
                                  f"{', '.join(sorted(FIELDS))}")
            if applies is not None and name in TUNABLE and name not in applies:
                raise ConfigError(f"{name}: this backend does not apply it, so it cannot be "
                                  f"tuned; it applies: {', '.join(sorted(applies))}")
            if name not in TUNABLE:
                if isinstance(spec, (Mapping, list, tuple, IntRange, FloatRange, Choice)):
                    raise ConfigError(f"{name} is not tuned; give a single value to fix it")
                fixed[name] = coerce_knob(name, spec)
                continue
            bound = parse_bound(name, spec, DEFAULT_BOUNDS[name])
            if bound is None:
                ranges.pop(name)
                value = coerce_knob(name, spec)
                fixed[name] = value.value if isinstance(value, PreemptionMode) else value
            else:
                ranges[name] = bound
        if "token_budget" not in ranges:
            # The grid and the chunk's cap need a budget even where none is tuned.
            fixed.setdefault("token_budget", base.token_budget)
        align = int(fixed.pop("budget_align", base.budget_align))
        return cls(ranges, fixed, align)

    # ------------------------------------------------------------------ the grid
    def _chunk_lo(self) -> int:
        if "chunk_size" in self.fixed:
            return int(self.fixed["chunk_size"])
        b = self.bounds.get("chunk_size")
        return int(b.lo) if isinstance(b, IntRange) else 64

    def budget_grid(self) -> tuple[int, ...]:
        """Budgets on the alignment grid inside the bounds, none below the smallest chunk."""
        if "token_budget" in self.fixed:
            v = int(self.fixed["token_budget"])
            eff = -(-v // self.budget_align) * self.budget_align
            return (v,) if eff >= self._chunk_lo() else ()
        b = self.bounds["token_budget"]
        assert isinstance(b, IntRange)
        a = self.budget_align
        first = -(-max(b.lo, self._chunk_lo()) // a)
        return tuple(k * a for k in range(max(first, 1), b.hi // a + 1))

    @property
    def budget_param(self) -> str:
        """The budget's Optuna parameter in this space (``budget_param``)."""
        return budget_param(self.budget_align)

    def _budget_multiples(self) -> tuple[int, int]:
        """The grid's ends as multiples of ``budget_align`` (the budget's parameter)."""
        grid = self.budget_grid()
        return grid[0] // self.budget_align, grid[-1] // self.budget_align

    def _empty_budget_message(self) -> str:
        return (f"no token budget on the {self.budget_align}-token grid fits the bounds "
                f"(budget {self.bounds.get('token_budget', self.fixed.get('token_budget'))}, "
                f"smallest chunk {self._chunk_lo()}); widen the budget range or lower "
                "chunk_size's lower bound")

    def chunk_cap(self, budget: int) -> tuple[int, int]:
        """The tuned chunk's range under ``budget`` (the chunk never exceeds the budget)."""
        b = self.bounds["chunk_size"]
        assert isinstance(b, IntRange)
        eff = -(-budget // self.budget_align) * self.budget_align
        return b.lo, max(b.lo, min(b.hi, eff))

    def chunk_from_fraction(self, budget: int, f: float) -> int:
        """The chunk that the fraction ``f`` of its range under ``budget`` encodes."""
        lo, hi = self.chunk_cap(budget)
        return min(hi, max(lo, round(math.exp(math.log(lo) + f * math.log(hi / lo)))))

    def _fraction_from_chunk(self, budget: int, chunk: int) -> float:
        lo, hi = self.chunk_cap(budget)
        if hi == lo:
            return 0.0
        return min(1.0, max(0.0, math.log(max(chunk, lo) / lo) / math.log(hi / lo)))

    # ------------------------------------------------------------------ sampling
    def suggest(self, trial: TrialLike) -> dict[str, Any]:
        """One config from an Optuna trial (define-by-run); fixed values included."""
        params: dict[str, Any] = {}
        if "token_budget" in self.bounds:
            first, last = self._budget_multiples()
            params[self.budget_param] = trial.suggest_int(self.budget_param, first, last,
                                                          log=True)
        for name, bound in self.bounds.items():
            if name == "token_budget":
                continue
            if name == "chunk_size":
                params[CHUNK_PARAM] = trial.suggest_float(CHUNK_PARAM, 0.0, 1.0)
            elif isinstance(bound, IntRange):
                params[name] = trial.suggest_int(name, bound.lo, bound.hi, log=bound.log)
            elif isinstance(bound, FloatRange):
                params[name] = trial.suggest_float(name, bound.lo, bound.hi, log=bound.log)
            else:
                params[name] = trial.suggest_categorical(name, list(bound.options))
        return self.config_of(params)

    def config_of(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The config Optuna parameters of this space stand for (what ``suggest`` gives
        for them); not checked against the bounds (``validate``): a queued trial's
        parameters may lie outside them, which Optuna runs as they are."""
        config: dict[str, Any] = dict(self.fixed)
        config["budget_align"] = self.budget_align
        if "token_budget" in self.bounds:
            config["token_budget"] = int(params[self.budget_param]) * self.budget_align
        budget = int(config["token_budget"])
        for name in self.bounds:
            if name == "chunk_size":
                config[name] = self.chunk_from_fraction(budget, float(params[CHUNK_PARAM]))
            elif name != "token_budget":
                config[name] = params[name]
        return config

    def to_params(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna params that ``suggest`` turns back into ``config`` (for enqueue_trial);
        a budget off the grid becomes the grid point the engine would round it to."""
        checked = self.validate(config)
        params: dict[str, Any] = {}
        budget = int(checked["token_budget"])
        if "token_budget" in self.bounds:
            first, last = self._budget_multiples()
            multiple = min(last, max(first, -(-budget // self.budget_align)))
            params[self.budget_param] = multiple
            budget = multiple * self.budget_align  # the chunk's cap is the grid point's
        for name, bound in self.bounds.items():
            value = checked[name]
            if name == "token_budget":
                continue
            if name == "chunk_size":
                params[CHUNK_PARAM] = self._fraction_from_chunk(budget, int(value))
            elif isinstance(bound, Choice):
                params[name] = getattr(value, "value", value)
            else:
                params[name] = value
        return params

    def outside(self, config: Mapping[str, Any]) -> str | None:
        """Why ``config`` lies outside this space, judged on the knobs it names that the
        space tunes or fixes (a trial's config, or one kept from an earlier space); None
        when none of them does. Unlike ``validate``, a knob it leaves out is no fault."""
        for name, value in config.items():
            bound = self.bounds.get(name)
            if isinstance(bound, Choice):
                if value not in bound.options:
                    return (f"{name}={value!r} is not one of "
                            f"{', '.join(map(str, bound.options))}")
            elif bound is not None:
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not number or not bound.lo <= value <= bound.hi:
                    return f"{name}={value!r} is outside [{bound.lo}, {bound.hi}]"
            elif name in self.fixed and value != getattr(self.fixed[name], "value",
                                                         self.fixed[name]):
                return f"{name}={value!r} but the space fixes it at {self.fixed[name]!r}"
        return None

    def validate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` checked against the knobs and this space; raises ConfigError."""
        for name in self.bounds:
            if name not in config:
                raise ConfigError(f"config lacks {name}, which this space tunes")
        full = {**self.fixed, "budget_align": self.budget_align, **config}
        values = EngineConfig().with_overrides(full).to_dict()
        for name, bound in self.bounds.items():
            v = values[name]
            if isinstance(bound, Choice):
                if v not in bound.options:
                    raise ConfigError(f"{name}={v!r} is outside the space; use one of: "
                                      f"{', '.join(map(str, bound.options))}")
            elif not bound.lo <= v <= bound.hi:
                raise ConfigError(f"{name}={v!r} is outside the space [{bound.lo}, {bound.hi}]")
        for name, v in self.fixed.items():
            if values[name] != getattr(v, "value", v):
                raise ConfigError(f"{name}={values[name]!r} but this space fixes it at {v!r}")
        return {k: values[k] for k in full}
