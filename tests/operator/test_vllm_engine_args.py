"""The command line a vLLM pod gets is one the pinned vLLM (v0.11.0) starts with.

vLLM checks its arguments when the engine is built and exits on a bad one: the pod then
crash-loops and a trial, which rolls every replica of a vLLM deployment, takes the whole
deployment down. These tests hold the renderer to vLLM's own rules, each cited by the
vLLM v0.11.0 file that makes it (read from that release's wheel).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from slopilot.operator.engine_deployment import vllm_args, with_vllm_knobs
from slopilot.operator.images import DEFAULT_IMAGES
from slopilot.operator.render import render_all
from slopilot.operator.spec import Backend, LLMDeploymentSpec, SpecError, parse_spec
from tests.support.spaces import sample_configs


def _spec(**spec: Any) -> LLMDeploymentSpec:
    return parse_spec({"metadata": {"name": "chat", "namespace": "team", "uid": "u1"},
                       "spec": {"backend": "vllm", "model": {"name": "m"}, **spec}})


def _pairs(spec: LLMDeploymentSpec) -> dict[str, str]:
    return dict(itertools.pairwise(vllm_args(spec)[0]))


def test_the_rules_below_are_those_of_the_image_the_operator_runs() -> None:
    assert DEFAULT_IMAGES[Backend.VLLM] == "vllm/vllm-openai:v0.11.0"


def _budget_holds_the_sequences(args: dict[str, str]) -> bool:
    # vllm/config/scheduler.py (v0.11.0), SchedulerConfig._verify_args: "max_num_batched_
    # tokens (...) must be greater than or equal to max_num_seqs (...)", a ValueError.
    return int(args["--max-num-batched-tokens"]) >= int(args["--max-num-seqs"])


def test_max_sequences_above_the_token_budget_is_not_a_command_vllm_refuses() -> None:
    spec = _spec(engine={"tokenBudget": 256, "chunkSize": 128, "maxNumSeqs": 1024})
    args = _pairs(spec)
    assert _budget_holds_the_sequences(args), args
    # One step schedules at most a token per request: more running requests than the
    # budget never run in the same step, so the budget is what vLLM is given.
    assert args["--max-num-seqs"] == "256"
    assert args["--max-num-batched-tokens"] == "256"


def test_a_user_who_set_max_sequences_above_the_budget_is_told() -> None:
    spec = _spec(engine={"tokenBudget": 256, "chunkSize": 128, "maxNumSeqs": 1024})
    assert any("spec.engine.maxNumSeqs=1024" in w and "256" in w for w in spec.warnings), \
        spec.warnings
    assert _spec(engine={"tokenBudget": 1024, "maxNumSeqs": 1024}).warnings == ()


def test_every_trial_of_a_vllm_deployment_renders_arguments_vllm_accepts() -> None:
    spec = _spec()
    refused = []
    for config in sample_configs(spec.tuning.space, 200):
        trial = dataclasses.replace(spec, engine=spec.engine.with_overrides(config))
        args = _pairs(trial)
        if not _budget_holds_the_sequences(args):
            refused.append((args["--max-num-batched-tokens"], args["--max-num-seqs"]))
    assert not refused, f"{len(refused)} of 200 trials crash-loop vLLM, e.g. {refused[:3]}"


def test_the_checksum_follows_what_vllm_is_given() -> None:
    # Two max_num_seqs that both clamp to the budget are one command line: no roll.
    a = render_all({"metadata": {"name": "chat", "namespace": "team", "uid": "u1"}},
                   _spec(engine={"tokenBudget": 256, "chunkSize": 128, "maxNumSeqs": 512}))
    b = render_all({"metadata": {"name": "chat", "namespace": "team", "uid": "u1"}},
                   _spec(engine={"tokenBudget": 256, "chunkSize": 128, "maxNumSeqs": 1024}))
    assert a.deployment["spec"]["template"] == b.deployment["spec"]["template"]


def test_swap_space_is_a_knob_vllm_v1_lacks() -> None:
    # vLLM v0.11.0 runs only the V1 engine (vllm/core/, V0's swapping scheduler, is gone);
    # V1 preempts by recompute and never reads CacheConfig.swap_space, which only
    # config/cache.py's verify_with_parallel_config checks against the node's memory
    # ("Too large swap space", a ValueError). The flag can only stop a pod.
    spec = _spec(engine={"swapSpaceGb": 8})
    args, lacking = vllm_args(spec)
    assert "--swap-space" not in args
    assert lacking == ("swap_space_gb",)
    assert "--swap-space" not in vllm_args(_spec())[0]


@pytest.mark.parametrize("size", [8, 16, 32, 64, 128])
def test_a_block_size_vllm_offers_is_passed(size: int) -> None:
    assert _pairs(_spec(engine={"blockSize": size}))["--block-size"] == str(size)


@pytest.mark.parametrize("size", [12, 24, 48, 100])
def test_a_block_size_vllm_has_no_choice_for_is_refused(size: int) -> None:
    # vllm/config/cache.py (v0.11.0): BlockSize = Literal[1, 8, 16, 32, 64, 128], which
    # engine/arg_utils.py turns into argparse choices: `--block-size 24` exits at once.
    with pytest.raises(SpecError) as err:
        _spec(engine={"blockSize": size})
    assert any(f"spec.engine.blockSize={size}" in p and "8, 16, 32, 64, 128" in p
               for p in err.value.problems), err.value.problems


def test_the_builtin_engine_keeps_any_block_size_in_its_range() -> None:
    spec = parse_spec({"spec": {"model": {"name": "m"}, "engine": {"blockSize": 24}}})
    assert spec.engine.block_size == 24


def test_block_size_8_is_passed_with_a_warning_about_the_default_backend() -> None:
    # vllm/v1/attention/backends/flash_attn.py (v0.11.0): FlashAttention, vLLM's default
    # on Ampere and Hopper GPUs (platforms/cuda.py), raises "Block size must be a
    # multiple of 16."; FlashInfer, the default on Blackwell, takes 8.
    spec = _spec(engine={"blockSize": 8})
    assert any("spec.engine.blockSize=8" in w and "multiple of 16" in w
               for w in spec.warnings), spec.warnings
    assert _spec(engine={"blockSize": 32}).warnings == ()


def test_a_config_put_in_rendered_arguments_is_that_config_as_rendered() -> None:
    """The take-back (vllm_take_back.py) puts an episode's config in the arguments the
    last accepted spec rendered: the result is what that spec renders with the config,
    its other arguments (model, parallelism) kept."""
    first, second = _spec(gpu=2), _spec(gpu=2, engine={
        "tokenBudget": 2048, "chunkSize": 256, "maxNumSeqs": 64, "blockSize": 32,
        "enablePrefixCaching": False})
    assert vllm_args(first)[0] != vllm_args(second)[0]
    assert with_vllm_knobs(vllm_args(first)[0], second.engine) == vllm_args(second)[0]
    assert with_vllm_knobs(vllm_args(second)[0], first.engine) == vllm_args(first)[0]


def test_arguments_the_operator_did_not_render_are_not_rewritten() -> None:
    args = vllm_args(_spec())[0]
    for lost in ("--max-num-seqs", "--enable-prefix-caching"):
        with pytest.raises(ValueError, match=lost):
            with_vllm_knobs([a for a in args if a != lost], _spec().engine)
