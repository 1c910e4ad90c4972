"""SearchSpace: defaults, narrowing and fixing, Optuna round trips, the grid, bad bounds."""

from __future__ import annotations

import optuna
import pytest

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.tuner.study.bounds import TUNABLE, IntRange
from slopilot.tuner.study.grid_sweep import grid_sweep
from slopilot.tuner.study.space import CHUNK_PARAM, SearchSpace
from tests.support.spaces import sample_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_default_space_tunes_every_tunable_knob_and_configs_are_valid() -> None:
    space = SearchSpace.from_bounds()
    assert set(space.bounds) == set(TUNABLE)
    for config in sample_configs(space, 200):
        engine = EngineConfig().with_overrides(config)  # never raises: chunk <= budget
        assert engine.token_budget % space.budget_align == 0
        assert 256 <= engine.token_budget <= 8192
        assert 64 <= engine.chunk_size <= engine.effective_budget
        assert 8 <= engine.max_num_seqs <= 1024


def test_the_budget_is_its_multiple_of_the_alignment_whatever_the_bounds() -> None:
    space = SearchSpace.from_bounds({"token_budget": [512, 2048]}, base=EngineConfig(
        budget_align=128))
    assert space.budget_grid() == tuple(range(512, 2049, 128))
    assert space.budget_param == "token_budget/128"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    config = space.suggest(trial)
    multiple = trial.params["token_budget/128"]
    assert isinstance(multiple, int) and config["token_budget"] == 128 * multiple
    # Log-uniform over the grid, as its multiples: one value per budget the engine runs.
    assert trial.distributions["token_budget/128"] == optuna.distributions.IntDistribution(
        4, 16, log=True)
    assert config["budget_align"] == 128


def test_fixed_and_narrowed_knobs_are_respected() -> None:
    space = SearchSpace.from_bounds({
        "preemption_mode": "recompute", "kv_watermark": [0.01, 0.02],
        "max_num_seqs": {"lo": 16, "hi": 64}, "chunk_size": [256, 512], "block_size": 32})
    assert "preemption_mode" not in space.bounds
    for config in sample_configs(space, 100):
        assert config["preemption_mode"] == "recompute"
        assert config["block_size"] == 32
        assert 0.01 <= config["kv_watermark"] <= 0.02
        assert 16 <= config["max_num_seqs"] <= 64
        assert 256 <= config["chunk_size"] <= min(512, config["token_budget"])
    # The smallest chunk lifts the budget grid: no budget below 256 could hold it.
    assert min(space.budget_grid()) >= 256


def test_params_round_trip_for_warm_start() -> None:
    space = SearchSpace.from_bounds()
    for config in sample_configs(space, 30, seed=3):
        params = space.to_params(config)
        study = optuna.create_study()
        study.enqueue_trial(params)
        again = space.suggest(study.ask())
        assert again == config
    # A budget off the grid snaps to the grid point the engine would round it to.
    config = {**sample_configs(space, 1)[0], "token_budget": 1000, "chunk_size": 500}
    assert space.to_params(config)["token_budget/256"] == 4  # 1024
    assert space.config_of(space.to_params(config))["token_budget"] == 1024
    assert 0.0 <= space.to_params(config)[CHUNK_PARAM] <= 1.0


def test_grid_covers_choices_and_holds_unswept_knobs_at_the_base() -> None:
    space = SearchSpace.from_bounds()
    base = EngineConfig(max_num_seqs=100, kv_watermark=0.1)
    grid = grid_sweep(space, {"token_budget": 4, "chunk_size": 3, "preemption_mode": 3},
                      base=base)
    assert {c["preemption_mode"] for c in grid} == {"recompute", "swap", "auto"}
    assert {c["max_num_seqs"] for c in grid} == {100}
    assert {c["kv_watermark"] for c in grid} == {0.1}
    assert len({c["token_budget"] for c in grid}) == 4
    assert len(grid) <= 4 * 3 * 3
    assert len({tuple(sorted(c.items())) for c in grid}) == len(grid)
    for c in grid:
        EngineConfig().with_overrides(c)
    full = grid_sweep(space, 2)
    assert len(full) > 100


def test_validate_refuses_configs_outside_the_space() -> None:
    space = SearchSpace.from_bounds({"max_num_seqs": [16, 64], "preemption_mode": "swap"})
    good = sample_configs(space, 1)[0]
    assert space.validate(good)["max_num_seqs"] == good["max_num_seqs"]
    with pytest.raises(ConfigError, match=r"max_num_seqs=512 is outside the space"):
        space.validate({**good, "max_num_seqs": 512})
    with pytest.raises(ConfigError, match="fixes it"):
        space.validate({**good, "preemption_mode": "auto"})
    with pytest.raises(ConfigError, match="lacks max_num_seqs"):
        space.validate({k: v for k, v in good.items() if k != "max_num_seqs"})


@pytest.mark.parametrize(("bounds", "message"), [
    ({"token_budgt": [128, 512]}, r"unknown knob 'token_budgt'"),
    ({"token_budget": [4096, 512]}, r"lo is above hi; swap them"),
    ({"token_budget": [64, 512]}, r"leaves the knob's range; use values in \[128, 16384\]"),
    ({"token_budget": [128, 512, 1024]},
     r"bounds\.token_budget=\[128, 512, 1024\]: expected two ends, lo and hi"),
    ({"max_num_seqs": [1.5, 8]}, r"expected whole numbers|expected an integer"),
    ({"kv_watermark": [0.0, 0.9]}, r"use values in \[0.0, 0.5\]"),
    ({"swap_timeout_ms": {"lo": 0, "hi": 10, "log": True}}, r"log scale needs lo > 0"),
    ({"max_num_seqs": {"low": 1, "hi": 8}}, r"unknown field\(s\) \['low'\]"),
    ({"preemption_mode": ["recompute", "bogus"]}, r"use one of: recompute, swap, auto"),
    ({"preemption_mode": []}, r"non-empty list"),
    ({"block_size": [8, 16]}, r"block_size is not tuned; give a single value"),
    ({"chunk_size": 4096, "token_budget": [128, 1024]}, r"no token budget .* fits"),
    ({"chunk_size": 2048, "token_budget": 1024}, r"exceeds the token budget"),
    ({"kv_watermark": "lots"}, r"kv_watermark='lots': expected a number"),
])
def test_bad_bounds_name_the_value_and_the_fix(bounds: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SearchSpace.from_bounds(bounds)


def test_everything_fixed_is_refused_and_grid_points_checked() -> None:
    with pytest.raises(ConfigError, match="nothing to tune"):
        SearchSpace.from_bounds({name: EngineConfig().to_dict()[name] for name in TUNABLE})
    with pytest.raises(ConfigError, match="points_per_knob"):
        grid_sweep(SearchSpace.from_bounds(), 0)
    with pytest.raises(ConfigError, match="cannot be tuned"):
        SearchSpace({"block_size": IntRange(8, 16)})


def test_a_backend_space_leaves_out_what_the_backend_does_not_apply() -> None:
    applies = {"token_budget", "chunk_size", "max_num_seqs"}
    space = SearchSpace.from_bounds({"max_num_seqs": [16, 64]}, applies=applies)
    assert set(space.bounds) == applies and space.fixed == {}
    assert all(set(c) == applies | {"budget_align"} for c in sample_configs(space, 20))
    with pytest.raises(ConfigError, match="kv_watermark: this backend does not apply it"):
        SearchSpace.from_bounds({"kv_watermark": [0.0, 0.1]}, applies=applies)
    chunk_only = SearchSpace.from_bounds(applies={"chunk_size"})
    assert chunk_only.fixed == {"token_budget": 1024}  # the chunk's cap needs a budget
