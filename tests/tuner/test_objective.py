"""score(): goodput and normalized SLO constraints from a ``WindowSummary``."""

from __future__ import annotations

import pytest

from slopilot.engine.slo import SLOSpec
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.study.objective import NO_SAMPLES, constraint_names, score, unmeasured
from tests.support.summaries import figures, window


def _summary(ttft: dict[str, float | None], tbt: dict[str, float | None],
             preempt: float = 0.0, goodput: float = 100.0) -> WindowSummary:
    return window({c: figures(ttft.get(c, 0.0), tbt.get(c, 0.0), goodput / 3)
                   for c in ("p0", "p1", "p2")}, preemptions=preempt,
                  config={"token_budget": 512})


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
    assert r.config == {"token_budget": 512}  # the simulated run's, by default


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


def test_a_class_without_samples_reads_as_met() -> None:
    r = score(_summary({"p0": None, "p1": 100}, {"p0": None, "p1": 50}, goodput=0.0), SLO)
    assert r.constraints[:2] == (NO_SAMPLES, NO_SAMPLES)
    assert r.goodput_tok_s == 0.0
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


def test_unmeasured_names_the_classes_with_an_slo_and_no_sample() -> None:
    # p2 sets no SLO term here: its absence is nobody's business; p0 has none of its P99s.
    s = window({"p1": figures(100.0, 50.0, 10.0)})
    assert unmeasured(s, SLO) == ("p0",)
    assert unmeasured(_summary({"p0": 50, "p1": 100}, {"p0": 10, "p1": 50}), SLO) == ()
    # A class with first tokens but no gap (one-token answers) was measured.
    assert unmeasured(window({"p0": figures(50.0, None), "p1": figures(100.0, 50.0)}),
                      SLO) == ()
