"""The administrator's ceiling on live trials an hour (``$SLOPILOT_MAX_TRIALS_PER_HOUR``,
policy.py): a CR's ``spec.tuning.maxTrials`` raises its loop's hourly cap with it, up to
the ceiling and no further, and a CR asking more is told so (docs/operations.md,
"spec.tuning")."""

# CustomObjectsApi (client 37) returns ``object``; the bodies are dicts.
# mypy: disable-error-code="index"

from __future__ import annotations

from typing import Any, cast

import pytest

from slopilot.operator.controller_build import build
from slopilot.operator.crd import crd_manifest, openapi_schema
from slopilot.operator.daemon import DaemonContext, controller_settings
from slopilot.operator.kube_handle import KubeDeploymentHandle
from slopilot.operator.policy import (
    DEFAULT_MAX_TRIALS_PER_HOUR,
    MAX_TRIALS_PER_HOUR_ENV,
    OperatorPolicy,
    PolicyError,
    trial_ceiling_warning,
)
from slopilot.operator.reconcile import reconcile
from slopilot.operator.settings import operator_policy
from slopilot.operator.spec import LLMDeploymentSpec, parse_spec
from slopilot.operator.spec_status import status_of
from slopilot.tuner.loop.controller import Controller
from tests.operator.operator_support import Cluster, llmd, operator_mint
from tests.support.crd_schema import apply_defaults
from tests.support.kube_server import RunningEmulator


def spec_of(**tuning: Any) -> LLMDeploymentSpec:
    body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team-a"},
            "spec": {"model": {"name": "m"}, "tuning": tuning}}
    return parse_spec(apply_defaults(openapi_schema(), body))


def test_the_ceiling_is_read_from_its_variable() -> None:
    assert operator_policy({MAX_TRIALS_PER_HOUR_ENV: " 200 "}).max_trials_per_hour == 200
    assert operator_policy({}).max_trials_per_hour == DEFAULT_MAX_TRIALS_PER_HOUR == 60
    assert operator_policy({MAX_TRIALS_PER_HOUR_ENV: ""}).max_trials_per_hour == 60


@pytest.mark.parametrize("raw", ["0", "-5", "lots", "2.5", "1e3"])
def test_a_ceiling_that_is_no_positive_count_stops_the_start_naming_it(raw: str) -> None:
    with pytest.raises(PolicyError) as exc:
        operator_policy({MAX_TRIALS_PER_HOUR_ENV: raw})
    message = str(exc.value)
    assert f"{MAX_TRIALS_PER_HOUR_ENV}={raw!r}" in message, message
    assert "e.g." in message and "unset it" in message, message


@pytest.mark.parametrize("value", [0, -1, True])
def test_the_policy_itself_refuses_a_ceiling_that_is_no_positive_count(value: int) -> None:
    with pytest.raises(PolicyError, match=MAX_TRIALS_PER_HOUR_ENV):
        OperatorPolicy(max_trials_per_hour=value)


def test_a_cr_asking_a_thousand_trials_gets_the_ceiling_an_hour() -> None:
    spec = spec_of(maxTrials=1000)
    s = controller_settings(spec, "team-a", "chat", trials_per_hour_ceiling=60)
    assert (s.max_trials, s.hourly_trials) == (1000, 60)
    s = controller_settings(spec, "team-a", "chat", trials_per_hour_ceiling=500)
    assert s.hourly_trials == 500


def test_under_the_default_ceiling_max_trials_still_raises_the_hour_with_it() -> None:
    assert controller_settings(spec_of(maxTrials=40), "team-a", "chat").hourly_trials == 40
    assert controller_settings(spec_of(maxTrials=5), "team-a", "chat").hourly_trials == 30
    # A ceiling under the loop's own default lowers every CR's hour, the default's too.
    assert controller_settings(spec_of(maxTrials=5), "team-a", "chat",
                               trials_per_hour_ceiling=10).hourly_trials == 10


def test_only_a_cr_over_the_ceiling_is_warned() -> None:
    policy = OperatorPolicy()
    assert trial_ceiling_warning(spec_of(maxTrials=60), policy) is None
    warning = trial_ceiling_warning(spec_of(maxTrials=1000), policy)
    assert warning is not None
    assert "spec.tuning.maxTrials=1000" in warning and "60" in warning
    assert MAX_TRIALS_PER_HOUR_ENV in warning and "trial_rate_limit" in warning
    # Tuning off: no trial runs, nothing to be told.
    assert trial_ceiling_warning(spec_of(maxTrials=1000, enabled=False), policy) is None


def test_the_daemon_builds_the_loop_under_the_ceiling_and_the_tenant_is_told(
        kube: RunningEmulator, cluster: Cluster) -> None:
    kube.install(crd_manifest())
    policy = operator_policy({MAX_TRIALS_PER_HOUR_ENV: "50"})
    body = cluster.create(llmd(tuning={"maxTrials": 1000}))
    outcome = reconcile(cluster.kube, body, policy=policy, mint=operator_mint(cluster))
    assert outcome.valid
    [told] = [w for w in outcome.warnings if "spec.tuning.maxTrials" in w]
    assert "1000" in told and "50" in told
    # ``kubectl describe``: the SpecWarning event (handlers.post_events) and the Valid
    # condition's message say it.
    [valid] = [c for c in status_of(body, outcome)["conditions"] if c["type"] == "Valid"]
    assert valid["status"] == "True" and told in valid["message"]

    built: list[DaemonContext] = []

    def factory(ctx: DaemonContext) -> Controller:
        built.append(ctx)
        return cast("Controller", None)

    build(cluster.kube, cast("KubeDeploymentHandle", None), cluster.get(), factory, policy)
    [ctx] = built
    assert (ctx.settings.max_trials, ctx.settings.hourly_trials) == (1000, 50)
