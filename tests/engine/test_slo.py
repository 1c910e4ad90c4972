"""SLOSpec: profiles, overrides, round trips and the errors users meet."""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.engine.request import Priority, Request
from slopilot.engine.slo import ClassSLO, SLOError, SLOSpec


@pytest.mark.parametrize(("profile", "tbt_p1"), [("strict", 50), ("standard", 100),
                                                 ("relaxed", 200)])
def test_profiles_set_the_p1_tier_and_keep_p0_realtime(profile: str, tbt_p1: float) -> None:
    spec = SLOSpec.from_profile(profile)
    assert spec.class_slo(Priority.P1).tbt_p99_ms == tbt_p1
    assert spec.class_slo(Priority.P1).ttft_p99_ms == 500
    assert spec.class_slo("p0") == ClassSLO(ttft_p99_ms=100, tbt_p99_ms=20,
                                            max_preemptions_per_min=10)
    assert spec.class_slo(2).best_effort
    assert spec.max_preemptions_per_min == 10
    assert spec.prefix_hit_min is None


def test_from_dict_overrides_and_crd_spelling() -> None:
    spec = SLOSpec.from_dict({
        "profile": "strict", "maxPreemptionsPerMinute": 4,
        "classes": {"p0": {"ttftP99Ms": 80}, "P1": {"tbt_p99_ms": None},
                    "batch": {"prefixHitMin": 0.9}}})
    assert spec.p0.ttft_p99_ms == 80 and spec.p0.tbt_p99_ms == 20
    assert spec.p1.tbt_p99_ms is None, "null makes a bound best effort"
    assert spec.p2.prefix_hit_min == 0.9
    assert spec.max_preemptions_per_min == 4
    assert spec.prefix_hit_min == 0.9


def test_default_profile_is_standard_and_round_trip() -> None:
    assert SLOSpec.from_dict({}).classes() == SLOSpec.from_profile("standard").classes()
    spec = SLOSpec.from_dict({"profile": "relaxed", "classes": {"p2": {"ttft_p99_ms": 5000}}})
    assert SLOSpec.from_dict(spec.to_dict()) == spec
    bare = SLOSpec(ClassSLO(1), ClassSLO(), ClassSLO())
    assert SLOSpec.from_dict(bare.to_dict()) == bare


@pytest.mark.parametrize(("data", "message"), [
    ({"profile": "fast"}, "profile='fast': unknown SLO profile; use one of: strict, standard, "
     "relaxed"),
    ({"profile": 3}, "profile=3"),
    ({"tbt": 50}, "unknown SLO field"),
    ({"classes": {"p3": {}}}, "classes.p3: not a class"),
    ({"classes": {"p1": {"ttft": 1}}}, "classes.p1.ttft: unknown objective"),
    ({"classes": {"p1": {"ttft_p99_ms": -5}}}, "classes.p1.ttft_p99_ms=-5: expected a positive"),
    ({"classes": {"p1": {"tbt_p99_ms": "fast"}}}, "tbt_p99_ms='fast'"),
    ({"classes": {"p0": {"prefix_hit_min": 1.5}}}, r"prefix_hit_min=1.5: expected a ratio"),
    ({"classes": ["p0"]}, "classes: expected a mapping"),
    ({"classes": {"p0": 100}}, "classes.p0: expected a mapping"),
    ({"max_preemptions_per_min": 0}, "^max_preemptions_per_min=0"),  # set for all: no class
])
def test_bad_specs_name_the_field_and_the_fix(data: Any, message: str) -> None:
    with pytest.raises(SLOError, match=message.replace("(", r"\(")):
        SLOSpec.from_dict(data)


@pytest.mark.parametrize(("key", "said"), [
    ("ttftP99ms", "unknown objective (did you mean ttftP99Ms?); use one of: "
     "maxPreemptionsPerMinute, prefixHitMin, tbtP99Ms, ttftP99Ms"),
    ("tbt_p99", "unknown objective (did you mean tbt_p99_ms?); use one of: "
     "max_preemptions_per_min, prefix_hit_min, tbt_p99_ms, ttft_p99_ms"),
    ("latency", "unknown objective; use one of: max_preemptions_per_min, prefix_hit_min, "
     "tbt_p99_ms, ttft_p99_ms")])
def test_an_unknown_objective_is_answered_in_the_spelling_it_was_written_in(
        key: str, said: str) -> None:
    # The file takes an LLMDeployment's spec.slo shape (camelCase); a camelCase typo was
    # told the snake_case names, and no nearest one.
    with pytest.raises(SLOError) as caught:
        SLOSpec.from_dict({"classes": {"p0": {key: 100}}})
    assert str(caught.value) == f"classes.p0.{key}: {said}"


def test_not_a_mapping_and_bad_class_lookup() -> None:
    with pytest.raises(SLOError, match="expected a mapping"):
        SLOSpec.from_dict(["strict"])  # type: ignore[arg-type]
    with pytest.raises(SLOError, match="priority 'p7' is not a class"):
        SLOSpec.from_profile("standard").class_slo("p7")
    with pytest.raises(SLOError, match="p1: expected a ClassSLO"):
        SLOSpec(ClassSLO(), {"ttft_p99_ms": 1}, ClassSLO())  # type: ignore[arg-type]


def test_a_request_meets_its_slo_within_the_ttft_target_and_one_percent_of_slow_gaps() -> None:
    slo = ClassSLO(ttft_p99_ms=100, tbt_p99_ms=20)
    assert slo.met(0.1, gaps=200, gaps_over_tbt=2)  # at the target, 1 % of gaps slow
    assert not slo.met(0.1001, gaps=200, gaps_over_tbt=0)
    assert not slo.met(0.05, gaps=200, gaps_over_tbt=3)
    assert not slo.met(0.05, gaps=0, gaps_over_tbt=1)
    assert ClassSLO().met(60.0, gaps=10, gaps_over_tbt=0)  # best effort: any TTFT


def test_the_engine_wide_preemption_limit_is_the_strictest_class_s() -> None:
    slo = SLOSpec.from_dict({"classes": {"p0": {"max_preemptions_per_min": 5},
                                         "p1": {"max_preemptions_per_min": 20}}})
    assert slo.max_preemptions_per_min == 5
    hits = SLOSpec.from_dict({"classes": {"p0": {"prefix_hit_min": 0.2},
                                          "p1": {"prefix_hit_min": 0.6}}})
    assert hits.prefix_hit_min == 0.6  # the highest any class asks for


def test_a_gap_at_the_tbt_target_is_not_over_it() -> None:
    """The judge counts gaps above the target, as ``met`` reads a P99 at it as met."""
    from slopilot.engine.slo import SLOJudge

    judge = SLOJudge(SLOSpec.from_dict({"classes": {"p0": {"ttft_p99_ms": 100,
                                                           "tbt_p99_ms": 20}}}))
    r = Request("r", [1, 2], priority=Priority.P0)
    for _ in range(5):
        judge.on_token_gap(r, 0.02)
    r.first_token_time = 0.05
    r.output_token_ids = [7] * 6
    assert judge.finished(r) is True
    judge.on_token_gap(r, 0.0201)
    assert judge.finished(r) is False


def test_a_class_slo_label_names_its_latency_objectives_exactly() -> None:
    """The ``slo`` label of the engine's verdict series, which the rules select by: two
    classes with other latency targets never share one, and one without any is plain."""
    assert ClassSLO(100, 20).label == "ttft_p99_ms=100.0,tbt_p99_ms=20.0"
    assert ClassSLO(ttft_p99_ms=100).label == "ttft_p99_ms=100.0"
    assert ClassSLO(tbt_p99_ms=12.5).label == "tbt_p99_ms=12.5"
    assert ClassSLO().label == ClassSLO(max_preemptions_per_min=3).label == "best_effort"
    # Preemption and prefix limits judge the engine, not one request: not in the label.
    assert ClassSLO(100, 20, 5, 0.5).label == ClassSLO(100, 20).label
    assert ClassSLO(100, 20).label != ClassSLO(100.0000001, 20).label
