"""``spec.tuning.minClassRequests`` and ``spec.tuning.maxTrial``: the trial floor and the
longest trial (docs/closed_loop.md, low traffic) reach the loop's ``ControllerSettings``;
absent, the settings' own defaults, a trial never shorter than one window; and
``spec.tuning.maxTrials``, which the hourly trial cap never cuts one episode short of
(docs/operations.md, "spec.tuning")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from slopilot.operator.crd import openapi_schema
from slopilot.operator.daemon import controller_settings
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.loop.settings import ControllerSettings
from tests.support.crd_schema import apply_defaults

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ControllerSettings)}


def settings_of(**tuning: Any) -> ControllerSettings:
    body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "m"}, "tuning": tuning}}
    return controller_settings(parse_spec(apply_defaults(openapi_schema(), body)),
                               "team-a", "chat")


def test_the_crs_floor_and_longest_trial_reach_the_loop() -> None:
    s = settings_of(minClassRequests=40, maxTrial="1h30m")
    assert (s.min_class_requests, s.max_trial_s) == (40, 5400.0)


def test_absent_they_are_the_loops_defaults() -> None:
    s = settings_of()
    assert (s.min_class_requests, s.max_trial_s) == (100, 1200.0)
    assert (s.min_class_requests, s.max_trial_s) == (DEFAULTS["min_class_requests"],
                                                     DEFAULTS["max_trial_s"])


def test_a_window_longer_than_the_default_trial_is_a_trial_of_one_window() -> None:
    # The default 20 minutes under a 30-minute window would be no trial at all: the
    # settings refuse it, and the daemon could not build the deployment's loop.
    s = settings_of(window="30m")
    assert (s.window_s, s.max_trial_s) == (1800.0, 1800.0)


@pytest.mark.parametrize(("tuning", "named"), [
    ({"minClassRequests": 0}, "spec.tuning.minClassRequests=0"),
    ({"minClassRequests": 100_001}, "spec.tuning.minClassRequests=100001"),
    ({"minClassRequests": "many"}, "spec.tuning.minClassRequests="),
    ({"maxTrial": "25h"}, "spec.tuning.maxTrial='25h'"),
    ({"maxTrial": "forever"}, "spec.tuning.maxTrial"),
    ({"window": "30m", "maxTrial": "20m"}, "spec.tuning.maxTrial='20m'"),
])
def test_a_bad_value_is_refused_by_field_value_and_fix(tuning: dict[str, Any],
                                                      named: str) -> None:
    body = {"model": {"name": "m"}, "tuning": tuning}
    with pytest.raises(SpecError) as exc:
        parse_spec({"spec": body})
    problems = [p for p in exc.value.problems if p.startswith(named)]
    assert problems, exc.value.problems
    assert any(w in problems[0] for w in ("e.g.", "use", "like", "expected")), problems


def test_max_trials_above_the_hourly_default_raises_the_hourly_cap_with_it() -> None:
    s = settings_of(maxTrials=40)
    assert (s.max_trials, s.hourly_trials) == (40, 40)


def test_by_default_30_trials_an_episode_and_30_an_hour() -> None:
    s = settings_of()
    assert (s.max_trials, s.hourly_trials) == (30, 30)
    assert (settings_of(maxTrials=5).hourly_trials) == 30  # the hour still allows rounds
