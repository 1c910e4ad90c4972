"""Configs drawn from a ``SearchSpace`` as Optuna would suggest them (tests only)."""

from __future__ import annotations

from typing import Any

import optuna

from slopilot.tuner.study.space import SearchSpace


def sample_configs(space: SearchSpace, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` configs from a seeded random sampler, each trial told so the next is new."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    return out
