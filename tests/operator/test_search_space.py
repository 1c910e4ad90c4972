"""What an LLMDeployment's trials search: ``slopilot tune``'s space, narrowed only where
the CR says so, and only over the knobs its backend applies."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.engine.config import EngineConfig
from slopilot.operator.daemon import study_name
from slopilot.operator.engine_deployment import vllm_args
from slopilot.operator.knobs import VLLM_APPLIES
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.tuner.study.bounds import DEFAULT_BOUNDS, TUNABLE, IntRange
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from tests.support.spaces import sample_configs

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spec(**spec: Any) -> Any:
    return parse_spec({"spec": {"model": {"name": "m"}, **spec}})


def test_an_empty_cr_searches_exactly_what_slopilot_tune_searches() -> None:
    spec = _spec()
    assert spec.tuning.bounds == {}  # nothing written, nothing filled in
    space = spec.tuning.space
    assert space == SearchSpace.from_bounds(None, base=spec.engine)  # `tune`'s call
    assert space.bounds == DEFAULT_BOUNDS
    assert space.bounds["token_budget"] == IntRange(128, 8192)
    assert space.bounds["max_num_seqs"] == IntRange(8, 1024, log=True)


def test_the_cr_bounds_hold_only_the_ends_the_user_wrote() -> None:
    spec = _spec(tuning={"bounds": {"tokenBudget": {"min": 512},
                                    "maxNumSeqs": {"min": 16, "max": 4096}}})
    assert spec.tuning.bounds == {"token_budget": {"lo": 512},
                                  "max_num_seqs": {"lo": 16, "hi": 4096}}
    space = spec.tuning.space
    assert space.bounds["token_budget"] == IntRange(512, 8192)  # `tune`'s upper end
    assert space.bounds["max_num_seqs"] == IntRange(16, 4096, log=True)  # wider is allowed
    assert space.bounds["chunk_size"] == DEFAULT_BOUNDS["chunk_size"]


@pytest.mark.parametrize(("bounds", "needle"), [
    ({"tokenBudget": {"min": 10000}},
     "spec.tuning.bounds.tokenBudget.min=10000 is above the upper end 8192 it leaves to "
     "the default: set max as well"),
    ({"maxNumSeqs": {"max": 4}},
     "spec.tuning.bounds.maxNumSeqs.max=4 is below the lower end 8 it leaves to the "
     "default: set min as well"),
    ({"tokenBudget": {"max": 20000}},
     "spec.tuning.bounds.tokenBudget=[128, 20000]: need 128 <= min <= max <= 16384"),
])
def test_a_half_written_bound_that_cannot_hold_names_the_missing_end(
        bounds: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(tuning={"bounds": bounds})
    assert any(needle in p for p in err.value.problems), err.value.problems


def test_a_knob_outside_the_default_range_is_a_start_not_an_error() -> None:
    spec = _spec(engine={"tokenBudget": 16384, "chunkSize": 512})
    assert spec.engine.token_budget == 16384
    assert spec.tuning.space.bounds["token_budget"] == IntRange(128, 8192)


def test_a_vllm_cr_searches_only_the_knobs_vllm_applies() -> None:
    spec = _spec(backend="vllm")
    space = spec.tuning.space
    assert set(space.bounds) == {"token_budget", "chunk_size", "max_num_seqs"}
    assert set(space.bounds) <= VLLM_APPLIES
    for config in sample_configs(space, 50):
        varied = {k for k in config if k != "budget_align"}  # fixed: the budget's grid
        assert varied <= VLLM_APPLIES, varied - VLLM_APPLIES


# Another valid value of each tuned knob, on the standard preset (budget 1024, chunk 512).
OTHER = {"token_budget": 2048, "chunk_size": 256, "max_num_seqs": 64,
         "preemption_mode": "swap", "recompute_max_tokens": 1024,
         "max_preemptions_per_step": 4, "swap_timeout_ms": 100.0,
         "p0_preempt_utilization": 0.5, "kv_watermark": 0.1}


@pytest.mark.parametrize("knob", TUNABLE)
def test_the_vllm_renderer_applies_exactly_the_knobs_it_declares(knob: str) -> None:
    spec = _spec(backend="vllm")
    moved = dataclasses.replace(spec, engine=spec.engine.with_overrides({knob: OTHER[knob]}))
    assert (vllm_args(moved)[0] != vllm_args(spec)[0]) == (knob in VLLM_APPLIES)


def _warm(space: SearchSpace, budget: int) -> dict[str, Any]:
    base = EngineConfig().to_dict()
    return {**{k: base[k] for k in space.bounds}, "token_budget": budget, "chunk_size": 256}


@pytest.mark.parametrize("edit", [
    {"tuning": {"bounds": {"tokenBudget": {"min": 768}}}},
    {"tuning": {"bounds": {"tokenBudget": {"min": 1024, "max": 4096}}}},
    {"tuning": {"bounds": {"tokenBudget": {"min": 512}}}, "engine": {"budgetAlign": 128}},
], ids=["min-raised", "both-moved", "align-changed"])
def test_an_edit_mid_episode_leaves_a_queued_warm_start_its_budget(
        tmp_path: Path, edit: dict[str, Any]) -> None:
    """The daemon builds a tuner over the CR's one study at each new generation, with that
    generation's space, and the warm starts the episode queued are still waiting in it:
    the budget was a rank on the bounds' grid, and a queued 1024 ran as 1280 or 1536."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    name = study_name("team-a", "chat", "u1")
    before = _spec(tuning={"bounds": {"tokenBudget": {"min": 512}}}).tuning.space
    tuner = ResumableTuner(open_study(storage, name), before)
    tuner.warm_start([_warm(before, 3072), _warm(before, 1024)])
    n0, c0 = tuner.ask()
    assert c0["token_budget"] == 3072
    after = _spec(**edit).tuning.space
    rebuilt = ResumableTuner(open_study(storage, name), after)
    rebuilt.resume(n0)
    _, c1 = rebuilt.ask()
    assert c1["token_budget"] == 1024 and c1["chunk_size"] == 256
    assert after.validate(c1) == c1
