"""A deployment's objectives, recorded as series: what the dashboards draw its SLO lines from.

One dashboard serves every deployment (chosen by namespace and name), so the lines cannot
be numbers baked into its JSON: each deployment's rules record its own targets, under its
identity labels, and only the ones it has.
"""

from __future__ import annotations

from typing import Any

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.rules import RuleOptions, render_rule_groups

TTFT = "slopilot:slo_ttft_p99:seconds"
TBT = "slopilot:slo_tbt_p99:seconds"
PREEMPTIONS = "slopilot:slo_preemptions_max:per_minute"
PREFIX_HIT = "slopilot:slo_prefix_hit_min:ratio"
UTILIZATION = "slopilot:alert_utilization_min:ratio"
OBJECTIVES = (TTFT, TBT, PREEMPTIONS, PREFIX_HIT, UTILIZATION)


def objectives(slo: dict[str, Any], namespace: str,
               options: RuleOptions | None = None) -> dict[tuple[str, str | None], str]:
    """(series, class) -> the recorded expression, every rule checked for its labels."""
    groups = render_rule_groups(SLOSpec.from_dict(slo), "chat", namespace=namespace,
                                options=options)
    out = {}
    for rule in groups["groups"][0]["rules"]:
        if rule.get("record") in OBJECTIVES:
            labels = dict(rule["labels"])
            cls = labels.pop("priority_class", None)
            assert labels == {"slopilot_namespace": namespace, "slopilot_deployment": "chat"}
            key = (rule["record"], cls)
            assert key not in out, f"{key} recorded twice"
            out[key] = rule["expr"]
    return out


def test_a_strict_and_a_relaxed_deployment_record_their_own_targets() -> None:
    strict = objectives({"profile": "strict"}, "team-b")
    relaxed = objectives({"profile": "relaxed"}, "team-c")
    assert strict[(TBT, "p1")] == "vector(0.05)"
    assert relaxed[(TBT, "p1")] == "vector(0.2)"
    for recorded in (strict, relaxed):
        assert recorded[(TBT, "p0")] == "vector(0.02)"
        assert recorded[(TTFT, "p0")] == "vector(0.1)"
        assert recorded[(TTFT, "p1")] == "vector(0.5)"
        assert recorded[(PREEMPTIONS, None)] == "vector(10)"
        # The batching alert's floor: RuleOptions' default, as the alert reads it.
        assert recorded[(UTILIZATION, None)] == "vector(0.6)"
        # P2 is best effort and no prefix hit ratio is expected: no series, so no line.
        assert {(TTFT, "p2"), (TBT, "p2"), (PREFIX_HIT, None)}.isdisjoint(recorded)


def test_every_objective_the_deployment_sets_is_recorded_and_none_it_does_not() -> None:
    recorded = objectives({"profile": "standard", "prefixHitMin": 0.9,
                           "classes": {"p0": {"ttftP99Ms": 50},
                                       "p2": {"ttftP99Ms": 2000}}},
                          "team-a", RuleOptions(busy_ratio_min=0.4))
    assert recorded == {
        (TTFT, "p0"): "vector(0.05)", (TTFT, "p1"): "vector(0.5)",
        (TTFT, "p2"): "vector(2)",
        (TBT, "p0"): "vector(0.02)", (TBT, "p1"): "vector(0.1)",
        (PREEMPTIONS, None): "vector(10)", (PREFIX_HIT, None): "vector(0.9)",
        (UTILIZATION, None): "vector(0.4)"}
    # Every digit, as the alerts compare: a 1000/30 ms target is not rounded to 0.0333.
    odd = objectives({"classes": {"p1": {"tbt_p99_ms": 1000 / 30}}}, "team-a")
    assert float(odd[(TBT, "p1")].removeprefix("vector(").removesuffix(")")) == \
        (1000 / 30) / 1000
