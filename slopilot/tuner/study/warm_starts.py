"""The queue of warm starts, judged against the space: configs queued as the next trials
(an offline study's best), each with the config it stands for in this space, and why a
queued trial is not to run as queued (queued in another space: the bounds or the
budget's alignment edited since, or an earlier slopilot's encoding). ``Tuner`` holds the
queue and asks its trials.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from slopilot.engine.config import ConfigError
from slopilot.tuner.study.space import SearchSpace

QUEUED_CONFIG = "queued_config"
"""A queued trial's user attribute: the config it was queued as, in the space then."""


def _knobs(config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in sorted(config.items()) if k != "budget_align")


class WarmStarts:
    """The warm-start queue of ``Tuner``'s study, in its space."""

    study: optuna.Study
    space: SearchSpace

    def _not_as_queued(self, trial: optuna.Trial, config: Mapping[str, Any]
                       ) -> tuple[str | None, dict[str, Any] | None]:
        """Why a queued ``trial``, suggested as ``config``, is not to run (None: it is
        not queued, or runs as queued), and the queued config to queue again in this
        space's encoding, if it lies in this space."""
        queued = trial.user_attrs.get(QUEUED_CONFIG)
        if queued is None:
            if not self._fixed_params(trial.number):
                return None, None  # sampled
            return ("queued by an earlier slopilot, in parameters this one does not read "
                    "(the budget was a rank on the bounds' grid then)"), None
        # The knobs it was queued with; the grid it was queued on is this space's now.
        knobs = {k: v for k, v in queued.items() if k != "budget_align"}
        shown = _knobs(knobs)
        if {**knobs, "budget_align": self.space.budget_align} == dict(config):
            try:
                self.space.validate(config)
            except ConfigError as exc:
                return f"queued {shown} lies outside the search space now: {exc}", None
            return None, None
        try:
            params = self.space.to_params(knobs)
        except ConfigError as exc:
            return f"queued {shown} lies outside the search space now: {exc}", None
        moved = self.space.config_of(params)
        if {k: v for k, v in moved.items() if k != "budget_align"} != knobs:
            a = self.space.budget_align
            return (f"queued {shown} is not on the search space's grid now (the "
                    f"{a}-token grid of budget_align={a}, where it would run as "
                    f"{_knobs(moved)})"), None
        if self._fixed_params(trial.number) == params:
            # Queued in these very terms already: queued again, it would come back so.
            return f"queued {shown} would run as {_knobs(config)}", None
        return (f"queued {shown} in another encoding of the space (its bounds or "
                "budget_align edited since): queued again in this one"), knobs

    def _fixed_params(self, number: int) -> dict[str, Any]:
        """The parameters trial ``number`` was queued with (Optuna's record of them)."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number == number:
                return dict(t.system_attrs.get("fixed_params") or {})
        return {}
    def warm_start(self, configs: Iterable[Mapping[str, Any]]) -> int:
        """Queue ``configs`` (e.g. an offline study's best) as the next trials; returns how
        many were queued (configs outside this space are refused with ConfigError)."""
        n = 0
        for config in configs:
            self._enqueue(config, skip_if_exists=True)
            n += 1
        return n

    def _enqueue(self, config: Mapping[str, Any], *, skip_if_exists: bool) -> None:
        """Queue ``config`` with the config it stands for in this space (``ask`` runs it
        as that or not at all)."""
        params = self.space.to_params(config)
        self.study.enqueue_trial(params, user_attrs={QUEUED_CONFIG: self.space.config_of(
            params)}, skip_if_exists=skip_if_exists)

