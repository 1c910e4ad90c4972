"""The search space: which knobs the tuner moves, within which bounds, on which grid.

Defaults come from the knobs' own ranges in ``EngineConfig`` metadata, narrowed to
where a serving deployment plausibly wants them; a deployment fixes a knob or narrows
its range with ``SearchSpace.from_bounds``: it writes ``[lo, hi]``, ``{lo, hi, log}``, a
list of choices, or a single value (the knob is then fixed), which ``parse_bound`` turns
into a checked bound. Two knobs are encoded, not sampled raw:

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

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from slopilot.engine.config import ConfigError, EngineConfig, PreemptionMode, coerce_knob

__all__ = ["CHUNK_PARAM", "DEFAULT_BOUNDS", "LEGACY_BUDGET_PARAM", "TUNABLE", "Bound",
           "Choice", "FloatRange", "IntRange", "SearchSpace", "TrialLike", "budget_param",
           "parse_bound", "user_name"]


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

    def _chunk_cap(self, budget: int) -> tuple[int, int]:
        b = self.bounds["chunk_size"]
        assert isinstance(b, IntRange)
        eff = -(-budget // self.budget_align) * self.budget_align
        return b.lo, max(b.lo, min(b.hi, eff))

    def _chunk_from_fraction(self, budget: int, f: float) -> int:
        lo, hi = self._chunk_cap(budget)
        return min(hi, max(lo, round(math.exp(math.log(lo) + f * math.log(hi / lo)))))

    def _fraction_from_chunk(self, budget: int, chunk: int) -> float:
        lo, hi = self._chunk_cap(budget)
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
                config[name] = self._chunk_from_fraction(budget, float(params[CHUNK_PARAM]))
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

    def grid(self, points_per_knob: int | Mapping[str, int] = 3, *,
             base: EngineConfig | None = None) -> list[dict[str, Any]]:
        """The cartesian grid for baselines: all choices, ``n`` points per numeric knob.

        With a mapping, knobs it leaves out get one point: ``base``'s value (the engine
        default if None) clamped into the bounds, as a grid sweep holds what it does not
        sweep at the deployment's setting.
        """
        defaults = (base or EngineConfig()).to_dict()
        def n_for(name: str) -> int:
            n = points_per_knob.get(name, 1) if isinstance(points_per_knob, Mapping) \
                else points_per_knob
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(f"points_per_knob[{name}]={n!r}: expected a whole number >= 1")
            return n

        axes: list[list[tuple[str, Any]]] = []
        for name, bound in self.bounds.items():
            n = n_for(name)
            if name == "token_budget":
                grid = self.budget_grid()
                idx = _spread(0, len(grid) - 1, n, log=False, integer=True)
                axes.append([(name, grid[int(i)]) for i in idx])
            elif name == "chunk_size":
                fractions = _spread(0.0, 1.0, n, False, False) if n > 1 else [None]
                axes.append([(CHUNK_PARAM, f) for f in fractions])
            elif isinstance(bound, Choice):
                options = bound.options if n > 1 or defaults[name] not in bound.options \
                    else (defaults[name],)
                axes.append([(name, o) for o in options])
            elif n == 1:
                v = min(bound.hi, max(bound.lo, defaults[name]))
                axes.append([(name, v)])
            else:
                axes.append([(name, v) for v in _spread(
                    bound.lo, bound.hi, n, bound.log, isinstance(bound, IntRange))])
        out, seen = [], set()
        for combo in itertools.product(*axes):
            config: dict[str, Any] = {**self.fixed, "budget_align": self.budget_align}
            config.update(combo)
            if CHUNK_PARAM in config:
                budget, f = int(config["token_budget"]), config.pop(CHUNK_PARAM)
                lo, hi = self._chunk_cap(budget)
                config["chunk_size"] = min(hi, max(lo, defaults["chunk_size"])) if f is None \
                    else self._chunk_from_fraction(budget, f)
            key = tuple(sorted(config.items()))
            if key not in seen:  # chunk fractions can collapse onto one value
                seen.add(key)
                out.append(config)
        return out


def _spread(lo: float, hi: float, n: int, log: bool, integer: bool) -> list[Any]:
    if n == 1 or lo == hi:
        points = [lo if not log else math.sqrt(lo * hi)]
    elif log:
        points = [math.exp(math.log(lo) + i * math.log(hi / lo) / (n - 1)) for i in range(n)]
    else:
        points = [lo + i * (hi - lo) / (n - 1) for i in range(n)]
    if integer:
        return sorted({round(p) for p in points})
    return points
