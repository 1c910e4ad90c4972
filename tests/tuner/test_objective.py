"""score(): goodput and normalized SLO constraints from a DESIGN §8 summary."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import NO_SAMPLES, SummaryError, constraint_names, score


def _summary(ttft: dict[str, float], tbt: dict[str, float], preempt: float = 0.0,
             goodput: float = 100.0) -> dict:
    return {
        "goodput_tok_s": goodput, "preemptions_per_min": preempt,
        "config": {"token_budget": 512},
        "classes": {c: {"ttft_p99_ms": ttft.get(c, 0.0), "tbt_p99_ms": tbt.get(c, 0.0),
                        "requests_finished": 10, "goodput_tok_s": goodput / 3}
                    for c in ("p0", "p1", "p2")},
    }


SLO = SLOSpec.from_dict({"profile": "standard", "max_preemptions_per_min": 10,
                         "classes": {"p0": {"ttft_p99_ms": 100, "tbt_p99_ms": 20},
                                     "p1": {"ttft_p99_ms": 500, "tbt_p99_ms": 100}}})


def test_constraints_are_measured_over_limit_minus_one_in_a_fixed_order() -> None:
    r = score(_summary({"p0": 150, "p1": 250, "p2": 9999}, {"p0": 10, "p1": 100},
                       preempt=20), SLO)
    assert r.constraint_names == ("p0.ttft_p99", "p0.tbt_p99", "p1.ttft_p99", "p1.tbt_p99",
                                  "preemptions_per_min")
    assert r.constraints == pytest.approx((0.5, -0.5, -0.5, 0.0, 1.0))
    assert not r.feasible  # p0 TTFT 50 % over, preemptions twice the limit
    assert r.violation == pytest.approx(1.5)
    assert r.goodput_tok_s == 100.0
    assert r.config == {"token_budget": 512}  # taken from the summary


def test_exactly_at_the_limit_is_feasible_and_best_effort_class_adds_no_term() -> None:
    r = score(_summary({"p0": 100, "p1": 500, "p2": 1e9}, {"p0": 20, "p1": 100, "p2": 1e9},
                       preempt=10), SLO)
    assert r.feasible
    assert len(r.constraints) == len(constraint_names(SLO)) == 5
    assert max(r.constraints) == pytest.approx(0.0)


def test_tighter_slo_makes_the_same_summary_less_feasible() -> None:
    s = _summary({"p0": 80, "p1": 400}, {"p0": 15, "p1": 80}, preempt=5)
    tight = SLOSpec.from_dict({"profile": "strict", "max_preemptions_per_min": 2,
                               "classes": {"p0": {"ttft_p99_ms": 50, "tbt_p99_ms": 10}}})
    loose, strict = score(s, SLO), score(s, tight)
    assert loose.feasible and not strict.feasible
    pairs = list(zip(loose.constraints, strict.constraints, strict=True))
    assert all(b >= a for a, b in pairs) and sum(b > a for a, b in pairs) >= 3


def test_class_without_samples_and_nan_read_as_met() -> None:
    s = _summary({"p0": math.nan, "p1": 100}, {"p0": math.nan, "p1": 50})
    s["classes"]["p0"]["tbt_p99_ms"] = None
    s["goodput_tok_s"] = math.nan
    r = score(s, SLO)
    assert r.constraints[:2] == (NO_SAMPLES, NO_SAMPLES)
    assert r.goodput_tok_s == 0.0  # never NaN: Optuna would refuse it
    assert r.feasible


def test_no_preemption_limit_means_no_preemption_term() -> None:
    slo = SLOSpec.from_dict({"profile": "relaxed"})
    names = constraint_names(slo)
    assert "preemptions_per_min" in names  # the profiles carry a limit of 10
    best_effort = SLOSpec.from_dict({"classes": {c: {"ttft_p99_ms": None, "tbt_p99_ms": None,
                                                     "max_preemptions_per_min": None}
                                                 for c in ("p0", "p1", "p2")}})
    assert constraint_names(best_effort) == ()
    assert score(_summary({}, {}), best_effort).feasible


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda s: s.pop("classes"), r"lacks 'classes'"),
    (lambda s: s["classes"].pop("p1"), r"lacks 'p1'"),
    (lambda s: s["classes"]["p0"].pop("ttft_p99_ms"), r"\['p0'\] lacks 'ttft_p99_ms'"),
    (lambda s: s.pop("goodput_tok_s"), r"lacks 'goodput_tok_s'"),
    (lambda s: s.__setitem__("preemptions_per_min", "many"), r"expected a number"),
])
def test_malformed_summaries_name_the_missing_figure(mutate: Callable[[dict], object],
                                                      message: str) -> None:
    s = _summary({"p0": 1}, {"p0": 1})
    mutate(s)
    with pytest.raises(SummaryError, match=message):
        score(s, SLO)
