"""A twin checked against an engine's iteration series: error, rescale, refit."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from slopilot.engine.sim.correction import (
    corrected,
    factors,
    predicted_seconds,
    refit,
    rescaled,
    twin_error,
    window_samples,
    windows_of,
)
from slopilot.engine.sim.profile_file import CostProfile
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.shape import FEATURES, IterationShape
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.twin import with_profile
from tests.support.profiles import make_profile

ATTENTION = ("decode_context", "decode_padded_context", "prefill_context",
             "prefill_attention")


def _plant_series(plant: CostProfile) -> str:
    """The /metrics text of a replica whose iterations cost what ``plant`` says."""
    run = simulate(with_profile(load_scenario("tiny-cpu"), plant), duration_s=20,
                   with_metrics=True)
    return run.metrics[0].decode()


def _heavier_attention(p: CostProfile, factor: float) -> CostProfile:
    ex = {k: v * (factor if k in ATTENTION else 1.0) for k, v in p.executor.items()}
    return dataclasses.replace(p, executor=MappingProxyType(ex))


def test_the_profile_that_made_the_series_has_no_error() -> None:
    twin = make_profile()
    samples = window_samples("", _plant_series(twin))
    assert {s.kind for s in samples} >= {"decode", "mixed"}
    assert twin_error(twin, samples) == pytest.approx(0.0, abs=1e-9)
    for s in samples:
        assert predicted_seconds(twin, s.shape) == pytest.approx(s.seconds, rel=1e-9)


def test_a_uniformly_slower_plant_is_fixed_by_one_factor() -> None:
    twin = make_profile()
    samples = window_samples("", _plant_series(rescaled(twin, 1.3)))
    error = twin_error(twin, samples)
    assert error == pytest.approx(1 / 1.3 - 1, rel=1e-6)
    fixed = rescaled(twin, 1 / (1 + error))
    assert twin_error(fixed, samples) == pytest.approx(0.0, abs=1e-9)
    assert "rescaled" in fixed.source


def test_refit_finds_which_terms_moved() -> None:
    twin = make_profile(executor={**make_profile().executor, "decode_context": 1e-6,
                                  "prefill_attention": 2e-8})
    plant = _heavier_attention(twin, 1.5)
    plant = dataclasses.replace(plant, host=MappingProxyType(
        {k: 2 * v for k, v in plant.host.items()}))
    samples = window_samples("", _plant_series(plant))
    one_factor = rescaled(twin, 1 / (1 + twin_error(twin, samples)))
    per_kind_rescaled = max(abs(twin_error(one_factor, [s])) for s in samples)
    better = refit(twin, samples, prior_weight=1e-4)
    per_kind_refit = max(abs(twin_error(better, [s])) for s in samples)
    assert per_kind_refit < per_kind_rescaled / 2
    assert abs(twin_error(better, samples)) < 0.01
    assert better.coefficient("decode_context") > twin.coefficient("decode_context")


def test_factors_say_what_a_correction_moved() -> None:
    # A reader of a corrected twin needs what it learned (attention 1.5x heavier, the
    # host twice as slow), per feature, not only that it was corrected.
    twin = make_profile(executor={**make_profile().executor, "decode_context": 1e-6})
    plant = _heavier_attention(twin, 1.5)
    moved = factors(twin, plant)
    assert moved["decode_context"] == pytest.approx(1.5)
    assert moved["tokens"] == pytest.approx(1.0)
    assert set(moved) == {f for f in FEATURES if twin.coefficient(f) > 0}
    assert factors(twin, rescaled(twin, 0.8)) == dict.fromkeys(moved, pytest.approx(0.8))
    assert factors(twin, twin) == dict.fromkeys(moved, 1.0)


def test_window_samples_take_the_difference_of_two_scrapes() -> None:
    twin = make_profile()
    text = _plant_series(twin)
    assert window_samples(text, text) == []
    assert [s.iterations > 0 for s in window_samples("", text)]


def test_bad_corrections_are_refused() -> None:
    with pytest.raises(ValueError, match="factor=0"):
        rescaled(make_profile(), 0)
    with pytest.raises(ValueError, match="no measured iteration time"):
        twin_error(make_profile(), [])
    with pytest.raises(ValueError, match="no window"):
        refit(make_profile(), [])
    for weight in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=rf"prior_weight={weight!r}: expected a finite"):
            refit(make_profile(), [], prior_weight=weight)


def _iterations(plant: CostProfile) -> list[tuple[float, float, IterationShape]]:
    """Decodes and chunks every 0.5 s for 20 s, each taking what ``plant`` says."""
    out = []
    for i in range(40):
        if i % 4:
            shape = IterationShape(iteration=1, tokens=4, sampled=4, decode_seqs=4,
                                   decode_batches=1, decode_context=400 + 4 * i,
                                   decode_padded_context=420 + 4 * i)
        else:
            shape = IterationShape(iteration=1, tokens=64, sampled=1, prefill_seqs=1,
                                   prefill_context=32 * i, prefill_attention=2048.0)
        out.append((0.5 * i, predicted_seconds(plant, shape), shape))
    return out


def test_windows_of_sums_iterations_per_window_and_kind() -> None:
    twin = make_profile()
    its = _iterations(twin)
    windows = windows_of(its, 10.0)
    assert [(w.kind, w.iterations) for w in windows] == [
        ("decode", 15.0), ("prefill", 5.0), ("decode", 15.0), ("prefill", 5.0)]
    assert sum(w.seconds for w in windows) == pytest.approx(sum(s for _, s, _ in its))
    assert twin_error(twin, windows) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="window_s=0"):
        windows_of(its, 0)


@pytest.mark.parametrize("refit_first", [True, False])
def test_corrected_puts_a_slower_plants_windows_right(refit_first: bool) -> None:
    twin = make_profile()
    windows = windows_of(_iterations(rescaled(twin, 1.3)), 5.0)
    assert twin_error(twin, windows) == pytest.approx(1 / 1.3 - 1, rel=1e-6)
    fixed = corrected(twin, windows, refit_first=refit_first)
    assert twin_error(fixed, windows) == pytest.approx(0.0, abs=1e-9)
    assert ("refit" if refit_first else "rescale") in fixed.source


def test_describe_factors_puts_the_largest_moves_first() -> None:
    from slopilot.engine.sim.correction import describe_factors

    learned = {"iteration": 1.02, "tokens": 1.74, "sampled": 0.5, "prefill_seqs": 1.53,
               "decode_context": 1.06, "prefill_context": 1.2, "decode_seqs": 0.96}
    assert describe_factors(learned) == ("sampled x0.50, tokens x1.74, prefill_seqs x1.53, "
                                         "prefill_context x1.20 and 1 more (the others "
                                         "within 5%)")
    assert describe_factors({"iteration": 1.04, "tokens": 0.97}) == "every feature within 5%"
    assert describe_factors({}) == "every feature within 5%"
    assert describe_factors({"tokens": 0.0, "iteration": 3.0}).startswith("tokens x0.00, ")
