"""Greedy tokens of the torch executor equal Hugging Face transformers on the same weights.

Each model is a small seeded transformers model saved to disk and loaded back through
our loader; the executor is driven by hand-made schedules (chunked prefill, mixed
prefill/decode batches, swap-out and swap-in with new block ids and poisoned old blocks).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from slopilot.engine.executors.batch import build_batch
from slopilot.engine.executors.loader import load_checkpoint
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.outputs import ScheduledSeq
from tests.engine.torch_driver import (
    Plan,
    generate,
    greedy,
    hf_greedy,
    save_hf_checkpoint,
    torch_threads,
)

transformers = pytest.importorskip("transformers")

MAX_TOKENS = 8
SMALL = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             initializer_range=0.2, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", {}),
    "llama-tied": ("LlamaForCausalLM", {"tie_word_embeddings": True}),
    "llama3-rope": ("LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE}),
    "linear-rope": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    "qwen2": ("Qwen2ForCausalLM", {"tie_word_embeddings": False}),
}
PLANS = {
    "chunked-mixed-swap": Plan(chunk=3, stagger=1, swap_out_at={4: "r1", 9: "r0"}),
    "whole-prompt": Plan(chunk=64, stagger=0),
}


def _build_hf(arch: str, extra: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    config_cls = (transformers.Qwen2Config if arch.startswith("Qwen2")
                  else transformers.LlamaConfig)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config_cls(**SMALL, **extra))
    return model.float().eval()


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    arch, extra = VARIANTS[request.param]
    hf = _build_hf(arch, extra)
    return hf, save_hf_checkpoint(hf, tmp_path_factory.mktemp(request.param))


def _prompts(seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=gen).tolist() for n in (5, 11, 23, 2)]


@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_greedy_tokens_match_transformers(checkpoint: tuple[torch.nn.Module, Path],
                                          plan_name: str) -> None:
    hf, path = checkpoint
    prompts = _prompts()
    executor = TorchExecutor(path, num_gpu_blocks=64, num_cpu_blocks=16, block_size=4)
    ours = generate(executor, prompts, [greedy(MAX_TOKENS)] * len(prompts), PLANS[plan_name])
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(hf, prompt, MAX_TOKENS), f"prompt {i}"


def test_logits_match_transformers_for_a_chunked_prompt(
        checkpoint: tuple[torch.nn.Module, Path]) -> None:
    """Logits of every position, computed in two chunks over the paged cache."""
    hf, path = checkpoint
    prompt = _prompts()[2]
    loaded = load_checkpoint(path)
    executor = TorchExecutor(loaded, num_gpu_blocks=16, num_cpu_blocks=0, block_size=4)
    table = [7, 2, 9, 0, 5, 11]
    rows = []
    for start, end in ((0, 10), (10, len(prompt))):
        seq = ScheduledSeq("r", prompt[start:end], start, table, True, greedy(1))
        batch = build_batch([seq], block_size=4, num_blocks=16, max_model_len=256,
                            device=torch.device("cpu"))
        every = torch.arange(end - start)
        with torch.inference_mode():
            rows.append(executor.model(batch.input_ids, batch.positions, batch.attention,
                                       executor.kv_cache, every))
    with torch.inference_mode():
        expected = hf(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(torch.cat(rows), expected, atol=1e-4, rtol=1e-4)


def test_rope_scaling_changes_the_output() -> None:
    """The scaled variant differs from the plain one, so its parity test means something."""
    plain = _build_hf("LlamaForCausalLM", {})
    scaled = _build_hf("LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE})
    ids = torch.tensor([_prompts()[2]])
    with torch.inference_mode():
        assert not torch.allclose(plain(input_ids=ids).logits, scaled(input_ids=ids).logits)
