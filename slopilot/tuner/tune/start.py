"""``slopilot tune``'s search space and start config, from its flags.

The space is ``SearchSpace.from_bounds`` over ``--bound`` and ``--set``, its errors named
by the flags the user wrote. The start config is the scenario's knobs with the ``--set``
values, fitted where the user left a knob alone: into the range ``--bound`` states for
it, and the chunk to the token budget (or, where the chunk cannot go that low, the
budget raised to the chunk). Without the fit, ``--set token_budget=256`` on a scenario
whose chunk is 2048 was refused ("chunk_size=2048 exceeds the token budget 256") though
the user never set the chunk and the study tunes it. The start config is a candidate the
trials are ranked against (``run.py``), so it must lie where the user asked the study to
look.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from slopilot.engine.config import ConfigError, EngineConfig, coerce_knob
from slopilot.tuner.study.bounds import BoundError, Choice
from slopilot.tuner.study.space import SearchSpace


@dataclass(frozen=True)
class StartConfig:
    config: Mapping[str, Any]
    """Every knob (``EngineConfig.to_dict``)."""
    fitted: Mapping[str, tuple[Any, Any]]
    """Each knob the user did not ``--set`` that the fit moved: (the scenario's, the
    start config's)."""

    def note(self) -> str | None:
        """One line on what the fit moved; None when it moved nothing."""
        if not self.fitted:
            return None
        moved = ", ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, (a, b) in self.fitted.items())
        return (f"start config: the scenario's knobs with {moved}, to fit --set and --bound "
                "(a chunk is at most the token budget)")

    def fitted_dict(self) -> dict[str, dict[str, Any]]:
        return {k: {"scenario": a, "start": b} for k, (a, b) in self.fitted.items()}


def _shown(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def search_space(bounds: Mapping[str, Any], fixed: Mapping[str, str],
                 raw_bounds: Collection[str], base: EngineConfig) -> SearchSpace:
    """The study's space; a ConfigError names the ``--bound`` or ``--set`` flags at fault
    as the user wrote them."""
    try:
        return SearchSpace.from_bounds(bounds, base=base)
    except ConfigError as exc:
        if set(exc.fields) == {"chunk_size", "token_budget"} and set(exc.fields) <= set(fixed):
            raise _both_set(fixed, base) from None
        given = [b for b in raw_bounds if b.partition("=")[0].strip() == exc.field]
        if not given:
            raise
        problem = exc.problem if isinstance(exc, BoundError) else str(exc)
        raise ConfigError(f"--bound {given[-1]}: {problem}", exc.field) from None


def _both_set(fixed: Mapping[str, str], base: EngineConfig) -> ConfigError:
    chunk = int(coerce_knob("chunk_size", fixed["chunk_size"]))
    budget = int(coerce_knob("token_budget", fixed["token_budget"]))
    align = int(coerce_knob("budget_align", fixed.get("budget_align", base.budget_align)))
    effective = -(-budget // align) * align
    return ConfigError(
        f"--set chunk_size={fixed['chunk_size']} exceeds the token budget {effective} of "
        f"--set token_budget={fixed['token_budget']} (a chunk is at most the budget): give "
        f"--set chunk_size={effective} or less, or --set token_budget={chunk} or more",
        "chunk_size", related=("token_budget",))


def fit_start(base: EngineConfig, fixed: Mapping[str, str], space: SearchSpace,
              stated: Collection[str]) -> StartConfig:
    """The start config: ``base`` with ``fixed``, and each knob not fixed fitted into
    ``space``'s bound where ``stated`` names it (a ``--bound`` flag), then the chunk to
    the budget. ``space`` was built from the same flags, so a fit exists: its grid holds
    a budget at least the smallest chunk its bounds allow."""
    knobs = base.to_dict()
    given = {name: coerce_knob(name, raw) for name, raw in fixed.items()}
    knobs.update({k: getattr(v, "value", v) for k, v in given.items()})
    for name in stated:
        bound = space.bounds.get(name)
        if bound is None or name in given:
            continue
        if isinstance(bound, Choice):
            if knobs[name] not in bound.options:
                knobs[name] = bound.options[0]
        else:
            knobs[name] = type(knobs[name])(min(bound.hi, max(bound.lo, knobs[name])))
    align = int(knobs["budget_align"])
    effective = -(-int(knobs["token_budget"]) // align) * align
    if knobs["chunk_size"] > effective:
        chunk = space.bounds.get("chunk_size")
        floor = knobs["chunk_size"] if chunk is None else int(getattr(chunk, "lo", 0))
        if floor <= effective:
            knobs["chunk_size"] = effective
        else:
            # The chunk cannot come down to the budget (fixed, or its bound's lower end
            # is above it), so the budget, not fixed (the space would have refused it),
            # goes up to the chunk.
            knobs["token_budget"] = floor
            knobs["chunk_size"] = min(knobs["chunk_size"], -(-floor // align) * align)
    config = EngineConfig().with_overrides(knobs).to_dict()
    fitted = {k: (v, config[k]) for k, v in base.to_dict().items()
              if k not in given and config[k] != v}
    return StartConfig(config, fitted)
