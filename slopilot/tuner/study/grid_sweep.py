"""A space's cartesian grid for baselines: every choice, a few points per numeric knob."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.tuner.study.bounds import Choice, IntRange
from slopilot.tuner.study.space import CHUNK_PARAM, SearchSpace


def grid_sweep(space: SearchSpace, points_per_knob: int | Mapping[str, int] = 3, *,
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
    for name, bound in space.bounds.items():
        n = n_for(name)
        if name == "token_budget":
            grid = space.budget_grid()
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
        config: dict[str, Any] = {**space.fixed, "budget_align": space.budget_align}
        config.update(combo)
        if CHUNK_PARAM in config:
            budget, f = int(config["token_budget"]), config.pop(CHUNK_PARAM)
            lo, hi = space.chunk_cap(budget)
            config["chunk_size"] = min(hi, max(lo, defaults["chunk_size"])) if f is None \
                else space.chunk_from_fraction(budget, f)
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
