"""Whether a study's trials were run under a space Optuna lets today's space go on in.

Optuna refuses, within one study, a parameter of another distribution kind, other
categorical choices or another ``log`` flag (``check_distribution_compatibility``, which
its storage runs at every suggest): a study made before a release that added a
``preemption_mode`` value, or flipped a default range's ``log``, fails every ask. Its
bounds may move (a range's ``lo``/``hi``): Optuna allows it, and so does this.

The rules are Optuna's own function, run here on each distinct distribution the trials
hold; the ``shape`` of a distribution (what those rules compare, not its bounds) names
the space for a study that goes on under it (``study_family.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    check_distribution_compatibility,
)
from optuna.trial import FrozenTrial

from slopilot.tuner.study.space import SearchSpace, user_name


@dataclass(frozen=True)
class SpaceConflict:
    """One parameter whose earlier trials' distribution today's space cannot share."""

    param: str
    then: str
    """What Optuna compared, as the earlier trials had it (``shape_text``)."""
    now: str

    def describe(self) -> str:
        knob = user_name(self.param)
        shown = self.param if knob == self.param else f"{knob} ({self.param})"
        return f"{shown}: {self.then} then, {self.now} now"


class _Recorder:
    """A trial that records the distribution of each suggest: the space's own
    ``suggest`` says which parameters it asks, so no second list of them is kept."""

    def __init__(self) -> None:
        self.distributions: dict[str, BaseDistribution] = {}

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        self.distributions[name] = IntDistribution(low, high, step=step, log=log)
        return low

    def suggest_float(self, name: str, low: float, high: float, *,
                      step: float | None = None, log: bool = False) -> float:
        self.distributions[name] = FloatDistribution(low, high, step=step, log=log)
        return low

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.distributions[name] = CategoricalDistribution(list(choices))
        return next(iter(choices))


def space_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The Optuna distribution of each parameter ``space`` asks."""
    recorder = _Recorder()
    space.suggest(recorder)
    return recorder.distributions


def _shape(d: BaseDistribution) -> tuple[Any, ...]:
    """What Optuna's compatibility check compares: the kind, a range's ``log``, a
    categorical's choices (never a range's bounds)."""
    if isinstance(d, CategoricalDistribution):
        return ("categorical", tuple(d.choices))
    if isinstance(d, (IntDistribution, FloatDistribution)):
        return (type(d).__name__, d.log)
    return (type(d).__name__,)


def shape_text(d: BaseDistribution) -> str:
    """The shape in a user's words: ``choices (recompute, swap)``, ``log-scaled``,
    ``linear``; with the kind where two differ in kind (``kinds``)."""
    if isinstance(d, CategoricalDistribution):
        return f"choices ({', '.join(str(c) for c in d.choices)})"
    if isinstance(d, (IntDistribution, FloatDistribution)):
        return "log-scaled" if d.log else "linear"
    return type(d).__name__


def _kind_text(d: BaseDistribution) -> str:
    kind = {CategoricalDistribution: "categorical", IntDistribution: "integer",
            FloatDistribution: "real"}.get(type(d), type(d).__name__)
    return f"{kind}, {shape_text(d)}"


def conflicts(trials: Iterable[FrozenTrial], now: Mapping[str, BaseDistribution]
              ) -> list[SpaceConflict]:
    """Each parameter of ``now`` whose distribution in some earlier trial Optuna would
    refuse it beside, once per parameter; empty where the space goes on in the study."""
    seen: dict[str, dict[tuple[Any, ...], BaseDistribution]] = {}
    for trial in trials:  # one pass; the distinct shapes only are checked
        for param, d in trial.distributions.items():
            if param in now:
                seen.setdefault(param, {}).setdefault(_shape(d), d)
    out: list[SpaceConflict] = []
    for param, shapes in sorted(seen.items()):
        new = now[param]
        for old in shapes.values():
            try:
                check_distribution_compatibility(old, new)
            except ValueError:
                kinds = type(old) is not type(new)
                now_text = _kind_text(new) if kinds else shape_text(new)
                if isinstance(new, CategoricalDistribution) and not kinds:
                    now_text = now_text.removeprefix("choices ")  # said once, before
                out.append(SpaceConflict(
                    param, _kind_text(old) if kinds else shape_text(old), now_text))
                break
    return out


def fingerprint(now: Mapping[str, BaseDistribution]) -> str:
    """12 hex digits of the space's shapes: a space Optuna would take in one study (the
    same kinds, ``log`` flags and choices; any bounds) has one fingerprint."""
    text = json.dumps(sorted((p, list(_shape(d))) for p, d in now.items()), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
