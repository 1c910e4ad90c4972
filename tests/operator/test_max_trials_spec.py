"""``spec.tuning.maxTrials`` reaches the loop, and the hourly trial cap never cuts one
episode short of it (docs/operations.md, "spec.tuning")."""

from __future__ import annotations

from typing import Any

from slopilot.operator.crd import openapi_schema
from slopilot.operator.daemon import controller_settings
from slopilot.operator.spec import parse_spec
from slopilot.tuner.loop.settings import ControllerSettings
from tests.support.crd_schema import apply_defaults


def settings_of(**tuning: Any) -> ControllerSettings:
    body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "m"}, "tuning": tuning}}
    return controller_settings(parse_spec(apply_defaults(openapi_schema(), body)),
                               "team-a", "chat")


def test_max_trials_above_the_hourly_default_raises_the_hourly_cap_with_it() -> None:
    s = settings_of(maxTrials=40)
    assert (s.max_trials, s.hourly_trials) == (40, 40)


def test_by_default_30_trials_an_episode_and_30_an_hour() -> None:
    s = settings_of()
    assert (s.max_trials, s.hourly_trials) == (30, 30)
    assert (settings_of(maxTrials=5).hourly_trials) == 30  # the hour still allows rounds
