"""The capacity answer built in the tense the verdict needs (``tune/tense.py``): the
verdict's present, the windows' past where the whole trace missed, or the refused past
where too many requests are too long. They were built in the present and rewritten by
text substitution, which also turned the idle floor's rule ("a verdict holds it only
under 90 ms") into a finding ("a verdict held it ...")."""

from __future__ import annotations

import dataclasses

from slopilot.tuner.tune.capacity import CapacityOutcome, capacity_answer
from slopilot.tuner.tune.idle_floor import IdleFloor
from slopilot.tuner.tune.tense import Tense, When
from tests.tuner.test_tune_capacity import FakeEvaluator

FLOOR = IdleFloor(cls="p0", prompt_tokens=4000, prompt_tokens_above=4100, ttft_ms=96.0,
                  limit_ms=100.0, requests=300)


def _found() -> CapacityOutcome:
    ev = FakeEvaluator({"a": 3})
    return capacity_answer(ev, [("trial 1", {"name": "a"})], 2, 8)  # type: ignore[arg-type]


def test_the_answer_in_each_tense() -> None:
    out = _found()
    assert out.sentence().startswith(
        "3 replicas hold the SLO in every window with 10% headroom, with trial 1's knobs "
        "(tried: trial 1 on 2: misses the SLO, trial 1 on 4: holds with headroom")
    windows = out.sentence(Tense(When.WINDOWS))
    assert windows.startswith("3 replicas held the SLO in every window"), windows
    assert "trial 1 on 4: holds with headroom" in windows, windows
    refused = out.sentence(Tense(When.REFUSED, keep=False))
    assert refused.startswith("3 replicas held the SLO in every window"), refused
    assert "trial 1 on 4: held with headroom" in refused and "holds" not in refused, refused
    fit = out.sentence(Tense(served=200))
    assert fit.startswith("3 replicas hold the SLO on the 200 requests that fit, in every "
                          "window with 10% headroom"), fit


def test_a_refused_floor_keeps_its_rule_in_the_present() -> None:
    ev = FakeEvaluator({"a": 99})
    out = capacity_answer(ev, [("trial 1", {"name": "a"})], 2, 4)  # type: ignore[arg-type]
    # Within the SLO short of the headroom on 4, and a floor that binds below the limit.
    tried = {n: dataclasses.replace(r, constraints=(-0.02,)) if n == 4 else r
             for n, r in out.tried.items()}
    out = dataclasses.replace(out, tried=tried, floors=(FLOOR,))
    refused = out.sentence(Tense(When.REFUSED, keep=False))
    assert refused.startswith("No replica count held the SLO with 10% headroom"), refused
    assert "a verdict holds it only under 90 ms" in refused, refused
    assert out.sentence().startswith("No replica count holds the SLO with 10% headroom")


def test_none_holds_in_the_past_where_refused() -> None:
    ev = FakeEvaluator({"a": 99})
    out = capacity_answer(ev, [("trial 1", {"name": "a"})], 2, 4)  # type: ignore[arg-type]
    refused = out.sentence(Tense(When.REFUSED, keep=False))
    assert refused.startswith("Not even 4 replicas held the SLO (tried: "), refused
