"""The fit recovers known coefficients from a synthetic executor, and fails by name."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from slopilot.engine.calibrate.design import GridOptions, design
from slopilot.engine.calibrate.fit import FitError, Observation, fit_host, fit_shapes
from slopilot.engine.calibrate.harness import Harness
from slopilot.engine.calibrate.runner import CalibrationOptions, Target, calibrate
from slopilot.engine.sim.profile_file import DeviceInfo, load_profile, write_profile
from slopilot.engine.sim.profiles import get_model
from slopilot.engine.sim.shape import FEATURES, shape_of_rows
from tests.engine.calibrate.synthetic import (
    EAGER,
    LOOP_S,
    SPILL,
    TRUE,
    SyntheticExecutor,
    SyntheticLoopClock,
)


def _measure(executor: SyntheticExecutor, grid: GridOptions, repeats: int = 5
             ) -> list[Observation]:
    specs = design(grid)
    samples = Harness(executor, specs, max_context=grid.max_context, repeats=repeats).run()
    return [Observation(s.spec.shape_at(executor.knee, executor.graph_batch), s.seconds,
                        s.spec.describe(),
                        s.spec.group) for s in samples]


def test_exact_times_give_back_the_exact_coefficients() -> None:
    fit = fit_shapes(_measure(SyntheticExecutor(), GridOptions(), repeats=1))
    for name, value in TRUE.items():
        assert fit.coefficients[name] == pytest.approx(value, rel=1e-6), name
    assert fit.max_err < 1e-6


def test_noisy_times_recover_the_coefficients_that_matter() -> None:
    fit = fit_shapes(_measure(SyntheticExecutor(noise=0.02, seed=3), GridOptions()))
    # The big terms come back within a few percent; the fit is within the noise.
    for name in ("iteration", "tokens", "decode_batches", "decode_padded_context",
                 "swap_blocks"):
        assert fit.coefficients[name] == pytest.approx(TRUE[name], rel=0.15), name
    assert fit.mape < 0.03
    assert set(fit.classes) == {"prefill", "multi", "decode", "ragged", "mixed", "large",
                                "large mixed", "multi mixed", "swap"}
    # Causal and dense attention pairs differ only by n(n-1)/2: noise may trade one for
    # the other, but not the time they predict together.
    exact = _measure(SyntheticExecutor(), GridOptions(), repeats=1)
    for o in exact:
        predicted = sum(fit.coefficients[f] * v
                        for f, v in zip(FEATURES, o.shape.vector(), strict=True))
        assert predicted == pytest.approx(o.seconds, rel=0.04), o.label


def test_one_disturbed_shape_does_not_drag_the_others() -> None:
    obs = _measure(SyntheticExecutor(), GridOptions(), repeats=1)
    hit = next(i for i, o in enumerate(obs) if o.group == "decode")
    obs[hit] = Observation(obs[hit].shape, obs[hit].seconds * 3, obs[hit].label, "decode")
    fit = fit_shapes(obs)
    others = [abs(e) for i, e in enumerate(fit.errors) if i != hit]
    assert max(others) < 0.01
    assert fit.worst(1)[0][0].label == obs[hit].label


def test_the_design_separates_every_feature() -> None:
    # Every executor feature; idle starts are the engine loop's, timed by the host phase,
    # and eager passes exist only on a device that replays decode graphs.
    # The knee sits inside each grid's padded range, as SmolLM2's L3 does in the full one.
    for graphs in (None, 256, 8):
        skip = {"idle_starts"} | ({"eager_passes"} if graphs is None else set())
        grid_features = [i for i, f in enumerate(FEATURES) if f not in skip]
        for opts, knee in ((GridOptions(), 21845), (GridOptions(quick=True), 4096)):
            x = np.array([s.shape_at(knee, graphs).vector()
                          for s in design(opts)])[:, grid_features]
            assert np.linalg.matrix_rank(x / x.max(axis=0)) == len(grid_features), graphs


def test_the_fit_recovers_the_eager_pass_of_a_graph_device() -> None:
    truth = {**TRUE, "eager_passes": EAGER}
    executor = SyntheticExecutor(truth, graph_batch=256)
    fit = fit_shapes(_measure(executor, GridOptions(), repeats=1))
    assert fit.coefficients["eager_passes"] == pytest.approx(EAGER, rel=1e-6)
    assert fit.coefficients["iteration"] == pytest.approx(TRUE["iteration"], rel=1e-6)
    assert fit.max_err < 1e-6
    # Without the feature the same times do not fit (9 % off on this grid): an eager
    # pass is paid once per pass, whatever its chunks (the H200's first CUDA-graph
    # calibration was 13 % off).
    assert fit_shapes(_measure(executor, GridOptions(), repeats=1),
                      [f for f in FEATURES if f != "eager_passes"]).mape > 0.05


def test_the_fit_recovers_a_rows_cost_past_the_gemm_knee() -> None:
    # As on this project's CPU: a few rows ride along with the first one's weight reads
    # (tokens cheap), past the knee each row costs its own multiply.
    truth = {**TRUE, "tokens": 2e-4, "tokens_past_knee": 6e-4}
    executor = SyntheticExecutor(truth)
    fit = fit_shapes(_measure(executor, GridOptions(), repeats=1))
    assert fit.coefficients["tokens_past_knee"] == pytest.approx(6e-4, rel=1e-6)
    assert fit.coefficients["tokens"] == pytest.approx(2e-4, rel=1e-6)
    assert fit.max_err < 1e-6
    # One slope cannot carry both: the decodes of a few rows are where it misses.
    single = fit_shapes(_measure(executor, GridOptions(), repeats=1),
                        [f for f in FEATURES if f != "tokens_past_knee"])
    assert single.classes["decode"].mape > 0.03


def test_the_fit_recovers_the_cost_beyond_the_cache_knee() -> None:
    truth = {**TRUE, "decode_spill": SPILL}
    executor = SyntheticExecutor(truth, knee=21845)
    observed = _measure(executor, GridOptions(), repeats=1)
    fit = fit_shapes(observed)
    assert fit.coefficients["decode_spill"] == pytest.approx(SPILL, rel=1e-6)
    assert fit.coefficients["decode_padded_context"] == pytest.approx(
        TRUE["decode_padded_context"], rel=1e-6)
    assert fit.max_err < 1e-6
    # The linear form alone (yesterday's) misses the large batches by far more.
    linear = fit_shapes(observed, features=[f for f in FEATURES if f != "decode_spill"])
    assert linear.classes["large"].max_err > 0.05


def test_coefficients_are_never_negative() -> None:
    # Times that fall with context would need a negative coefficient: clamped to 0.
    obs = [Observation(shape_of_rows([(1, c, True)] * 4), 0.01 - c * 1e-6, f"c{c}", "decode")
           for c in (10, 100, 1000, 5000)]
    assert all(v >= 0 for v in fit_shapes(obs).coefficients.values())


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_shape_without_a_usable_time_is_named(bad: float) -> None:
    obs = [Observation(shape_of_rows([(1, 5, True)]), 0.01, "fine", "decode"),
           Observation(shape_of_rows([(16, 0, True)]), bad, "chunk 16@0", "prefill")]
    with pytest.raises(FitError, match=r"chunk 16@0: .* s\).*zero, negative or non-finite"):
        fit_shapes(obs)


def test_the_host_fit_minimises_the_whole_steps_error() -> None:
    shapes = [shape_of_rows([(1, 5, True)] * d) for d in (1, 2, 4, 8, 16)]
    host = [2e-4 + 1e-5 * s.decode_seqs for s in shapes]
    steps = [h + 0.01 for h in host]
    fit = fit_host([Observation(s, h, str(i), "decode") for i, (s, h) in
                    enumerate(zip(shapes, host, strict=True))], steps)
    c = fit.coefficients
    assert c["iteration"] == pytest.approx(2e-4, rel=1e-6)
    # Decode-only steps cannot tell tokens, sampled rows and decodes apart; their sum is
    # what such steps pin down.
    assert c["tokens"] + c["sampled"] + c["decode_seqs"] == pytest.approx(1e-5, rel=1e-6)
    assert fit.max_err < 1e-9


def _target(executor: SyntheticExecutor) -> Target:
    return Target(executor, get_model("tiny-random"), DeviceInfo("cpu", "synthetic", 1),
                  "float32", 64 * 1024 ** 2, {"torch": "test"}, SyntheticLoopClock())


def test_calibrate_end_to_end_on_the_synthetic_executor(tmp_path: Path) -> None:
    opts = CalibrationOptions(grid=GridOptions(token_budget=256, max_num_seqs=16,
                                               max_context=512, quick=True), repeats=3)
    result = calibrate(_target(SyntheticExecutor(noise=0.01)), opts)
    p = result.profile
    assert p.fit is not None and p.fit.mape < 0.05
    assert p.fit.max_context == 512 and p.fit.host_steps == len(result.host_steps) > 0
    assert p.executor["decode_batches"] == pytest.approx(TRUE["decode_batches"], rel=0.3)
    # Every step on the synthetic loop clock costs LOOP_S beyond the executor's time.
    assert all(v >= 0 for v in p.host.values())
    assert p.host["iteration"] == pytest.approx(LOOP_S, rel=0.1)
    loaded = load_profile(write_profile(p, tmp_path / "p.yaml"))
    assert loaded.executor == p.executor and loaded.fit == p.fit


def test_a_form_that_cannot_fit_is_refused_naming_the_shapes() -> None:
    executor = SyntheticExecutor(extra=2e-4)  # decode time grows with decodes squared
    opts = CalibrationOptions(grid=GridOptions(), repeats=1, tolerance=0.02, host=False)
    with pytest.raises(FitError) as err:
        calibrate(_target(executor), opts)
    text = str(err.value)
    assert "above --tolerance 0.02" in text and "decodes@" in text
    assert "Nothing was written" in text and "--tolerance" in text


def test_the_harness_takes_the_median_or_the_fastest_round() -> None:
    from slopilot.engine.calibrate.harness import HarnessError

    specs = design(GridOptions(quick=True, token_budget=256, max_num_seqs=16,
                               max_context=512))
    noisy = SyntheticExecutor(noise=0.3, seed=1)
    median = Harness(noisy, specs, max_context=512, repeats=5).run()
    fastest = Harness(SyntheticExecutor(noise=0.3, seed=1), specs, max_context=512,
                      repeats=5, statistic="min").run()
    for m, f in zip(median, fastest, strict=True):
        assert f.seconds == min(f.times) and m.seconds == sorted(m.times)[2]
    with pytest.raises(HarnessError, match="--statistic 'mean'"):
        Harness(noisy, specs, max_context=512, statistic="mean")
    with pytest.raises(HarnessError, match="KV cache has 10 blocks; the grid needs"):
        Harness(SyntheticExecutor(num_gpu_blocks=10), specs, max_context=512)
