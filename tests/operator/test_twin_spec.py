"""``spec.twin``: one place for the controller's twin (profile, maxError, correction).

``spec.tuning.twin.{maxError, correction}`` is where the last two used to be: it still
works, with a warning that names the old field, the new one and the fix (a Warning
event and the Valid condition's message), and a value there that contradicts
``spec.twin`` is refused naming both.
"""

# mypy: disable-error-code="attr-defined,index,union-attr"

from __future__ import annotations

import re
from typing import Any

import kopf
import kubernetes.client
import pytest

from slopilot.operator.crd import openapi_schema
from slopilot.operator.daemon import controller_settings
from slopilot.operator.handlers import post_events
from slopilot.operator.reconcile import Outcome
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.spec_status import status_of
from slopilot.operator.twin_spec import ProfileRef, TwinSpec
from slopilot.tuner.loop.settings import TwinCorrection
from tests.operator.test_crd import errors_of, sample
from tests.support.crd_schema import apply_defaults, prune
from tests.support.kube_server import RunningEmulator


def body(twin: Any = None, old: Any = None) -> dict[str, Any]:
    """The builtin sample with ``spec.twin`` and the deprecated ``spec.tuning.twin``."""
    out = sample("llmdeployment-builtin.yaml")
    out["metadata"] = {"name": "chat", "namespace": "team-a", "generation": 2}
    if twin is not None:
        out["spec"]["twin"] = twin
    if old is not None:
        out["spec"]["tuning"]["twin"] = old
    return out


def admitted(raw: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores of ``raw``: pruned and defaulted by the CRD's schema."""
    schema = openapi_schema()
    return dict(apply_defaults(schema, prune(schema, raw)))


def problems_of(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    return err.value.problems


# ------------------------------------------------------------------ the new place

def test_the_twin_defaults_to_the_datasheet_checked_within_15_percent_and_refit() -> None:
    spec = parse_spec(admitted(body()))
    assert spec.twin == TwinSpec(profile=None, max_error=0.15,
                                 correction=TwinCorrection.REFIT)
    assert spec.warnings == ()
    # The schema fills in no twin setting anywhere: a default in the old place would look
    # like a deprecated field the user set, one in the new place would contradict it.
    stored = admitted(body())
    assert "twin" not in stored["spec"] and "twin" not in stored["spec"]["tuning"]


def test_spec_twin_holds_the_profile_the_bound_and_the_correction() -> None:
    raw = body({"profile": {"configMapName": "smol-profile"}, "maxError": 0.3,
                "correction": "rescale"})
    assert errors_of(raw) == []
    spec = parse_spec(admitted(raw))
    assert spec.twin == TwinSpec(ProfileRef("smol-profile", "profile.yaml"), 0.3,
                                 TwinCorrection.RESCALE)
    assert spec.warnings == ()
    settings = controller_settings(spec, "team-a", "chat")
    assert (settings.twin_max_error, settings.twin_correction) == (0.3, TwinCorrection.RESCALE)
    assert parse_spec(body({"maxError": 2})).twin.max_error == 2.0  # an int is a number


@pytest.mark.parametrize(("twin", "needle"), [
    ({"maxError": 0}, "spec.twin.maxError=0: use a relative error in (0, 10)"),
    ({"maxError": -0.1}, "spec.twin.maxError=-0.1: use a relative error in (0, 10)"),
    ({"maxError": 10}, "spec.twin.maxError=10: use a relative error in (0, 10)"),
    ({"maxError": "high"}, "spec.twin.maxError='high': expected a number"),
    ({"maxError": True}, "spec.twin.maxError=True: expected a number"),
    ({"correction": "guess"}, "spec.twin.correction='guess': use one of none, rescale, refit"),
    ({"correction": 1}, "spec.twin.correction=1: use one of none, rescale, refit"),
    ({"maxErr": 0.2}, "spec.twin: unknown field(s) maxErr; the fields are profile, "
                      "maxError, correction"),
])
def test_a_bad_twin_setting_is_refused_naming_the_field_and_the_fix(twin: dict[str, Any],
                                                                    needle: str) -> None:
    assert any(needle in p for p in problems_of(body(twin))), problems_of(body(twin))
    if "maxErr" not in twin:  # an unknown field the API server prunes instead
        assert errors_of(body(twin)) != []  # the API server refuses it first


# ------------------------------------------------------------------ the old place

@pytest.mark.parametrize(("old", "camel", "value", "attr"), [
    ({"maxError": 0.3}, "maxError", 0.3, "max_error"),
    ({"correction": "none"}, "correction", TwinCorrection.NONE, "correction"),
])
def test_the_old_place_still_works_and_says_where_the_field_moved(
        old: dict[str, Any], camel: str, value: Any, attr: str) -> None:
    raw = body(old=old)
    assert errors_of(raw) == []
    assert admitted(raw)["spec"]["tuning"]["twin"] == old  # not pruned: kept as written
    spec = parse_spec(admitted(raw))
    assert getattr(spec.twin, attr) == value
    [warning] = spec.warnings
    for needle in (f"spec.tuning.twin.{camel}", "deprecated", f"spec.twin.{camel}",
                   "remove spec.tuning.twin"):
        assert needle in warning, warning


def test_the_same_value_in_both_places_is_accepted_with_the_warning() -> None:
    spec = parse_spec(body({"maxError": 0.3, "correction": "rescale"},
                           old={"maxError": 0.3, "correction": "rescale"}))
    assert (spec.twin.max_error, spec.twin.correction) == (0.3, TwinCorrection.RESCALE)
    assert len(spec.warnings) == 2
    assert all("spec.tuning.twin." in w and "remove spec.tuning.twin" in w
               for w in spec.warnings), spec.warnings


@pytest.mark.parametrize(("twin", "old", "needles"), [
    ({"maxError": 0.3}, {"maxError": 0.5},
     ("spec.twin.maxError=0.3", "spec.tuning.twin.maxError=0.5", "remove spec.tuning.twin")),
    ({"correction": "rescale"}, {"correction": "none"},
     ("spec.twin.correction='rescale'", "spec.tuning.twin.correction='none'",
      "remove spec.tuning.twin")),
])
def test_different_values_in_both_places_are_refused_naming_both(
        twin: dict[str, Any], old: dict[str, Any], needles: tuple[str, ...]) -> None:
    problems = problems_of(body(twin, old))
    assert any(all(n in p for n in needles) for p in problems), problems


def test_the_old_schemas_defaults_yield_to_the_new_place() -> None:
    """The CRD used to default spec.tuning.twin to {maxError: 0.15, correction: refit}, so
    every LLMDeployment created before the move carries those two values without its
    owner having written them: they give way to spec.twin (and still ask to be removed)."""
    spec = parse_spec(body({"maxError": 0.3, "correction": "none"},
                           old={"maxError": 0.15, "correction": "refit"}))
    assert (spec.twin.max_error, spec.twin.correction) == (0.3, TwinCorrection.NONE)
    assert len(spec.warnings) == 2
    assert all("defaults" in w and "remove spec.tuning.twin" in w for w in spec.warnings)


@pytest.mark.parametrize(("old", "needle"), [
    ({"maxError": 0}, "spec.tuning.twin.maxError=0: use a relative error in (0, 10)"),
    ({"maxError": "high"}, "spec.tuning.twin.maxError='high': expected a number"),
    ({"correction": "guess"}, "spec.tuning.twin.correction='guess': use one of none, "
                              "rescale, refit"),
    ({"maxErr": 0.2}, "spec.tuning.twin: unknown field(s) maxErr"),
    ("refit", "spec.tuning.twin='refit': expected a mapping"),
])
def test_a_bad_value_in_the_old_place_is_named_there(old: Any, needle: str) -> None:
    assert any(needle in p for p in problems_of(body(old=old))), problems_of(body(old=old))


def test_the_crd_keeps_the_old_place_and_marks_it_deprecated() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    old = spec["tuning"]["properties"]["twin"]
    assert set(old["properties"]) == {"maxError", "correction"}
    for schema in (old, *old["properties"].values()):
        assert "Deprecated: moved to spec.twin" in schema["description"]
        assert "default" not in schema
    new = spec["twin"]["properties"]
    assert set(new) == {"profile", "maxError", "correction", "dispatch"}
    assert all("default" not in new[k] for k in ("maxError", "correction", "dispatch"))
    assert new["correction"]["enum"] == [c.value for c in TwinCorrection]


# ------------------------------------------------------------------ what the user sees

def test_the_warning_is_in_the_valid_condition_and_a_warning_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(body(old={"maxError": 0.3}))
    outcome = Outcome(warnings=spec.warnings)
    valid = next(c for c in status_of(body(), outcome)["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "True" and valid["reason"] == "SpecAccepted"
    assert "spec.tuning.twin.maxError" in valid["message"]
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "info", lambda _b, *, reason, message: posted.append(
        ("info", reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda _b, *, reason, message: posted.append(
        ("warn", reason, message)))
    post_events(body(), outcome, reason="Reconciled")
    [(level, _, message)] = [p for p in posted if p[1] == "SpecWarning"]
    assert level == "warn" and re.search(r"spec\.tuning\.twin\.maxError.*spec\.twin\.maxError",
                                         message), message
    posted.clear()
    post_events(body(), Outcome(), reason="Reconciled")
    assert not [p for p in posted if p[1] == "SpecWarning"]


def test_the_operator_posts_the_deprecation_as_a_kubernetes_warning_event(
        kube_login: RunningEmulator, kube_client: kubernetes.client.ApiClient) -> None:
    from tests.operator.operator_support import Cluster, llmd, operator, wait_for

    cluster = Cluster(kube_client)
    with operator(kube_login):
        cluster.create(llmd(tuning={"enabled": False, "twin": {"correction": "rescale"}}))
        event = wait_for(lambda: cluster.events("SpecWarning"),
                         what="the deprecation event")[0]
        assert event.type == "Warning"
        assert "spec.tuning.twin.correction" in event.message
        assert "spec.twin.correction" in event.message
        valid = wait_for(lambda: cluster.condition("Valid"), what="the Valid condition")
        assert valid["status"] == "True" and "spec.tuning.twin.correction" in valid["message"]


# ------------------------------------------------------------------ dispatch

def test_the_twin_dispatches_at_random_unless_told_a_router_spreads_the_load() -> None:
    """The operator's Service spreads connections at random (kube-proxy's iptables and
    nftables modes): the twin sizes the fleet so unless the CR says a load-aware router
    (a gateway's least-request policy) or IPVS's round robin is in front."""
    from slopilot.engine.sim.dispatch import Dispatch
    assert parse_spec(admitted(body())).twin.dispatch is Dispatch.RANDOM
    for value in ("least_requests", "round_robin", "random"):
        assert parse_spec(admitted(body({"dispatch": value}))).twin.dispatch == value


@pytest.mark.parametrize("value", ["least-loaded", "LEAST_REQUESTS", 3, None, ["random"]])
def test_a_dispatch_the_twin_cannot_model_is_refused_naming_the_choices(value: Any) -> None:
    raw = body({"dispatch": value})
    if value is not None:
        assert errors_of(raw), "the CRD's enum refuses it at the API server too"
    problems = problems_of(raw)
    assert any("spec.twin.dispatch" in p and "random, round_robin, least_requests" in p
               for p in problems), problems
