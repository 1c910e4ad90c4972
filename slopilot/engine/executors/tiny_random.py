"""A seeded random tiny Llama checkpoint: no download, same bytes for the same seed.

The tokenizer is a byte-level BPE trained on a short built-in text, so any string
encodes and the vocabulary (about 400 tokens) matches the model's output layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from slopilot.engine.executors.llama import LlamaConfig, LlamaForCausalLM

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A serving engine batches requests so "
    "that the accelerator stays busy; each iteration mixes prefill chunks with decode "
    "steps. Latency objectives bound the time to the first token and the time between "
    "tokens. When memory runs out, the scheduler preempts a request and either swaps its "
    "cache to host memory or recomputes it later. Hello, world! What is the weather like "
    "today? Tell me a story about a cat, a dog and a bird who live in the city. "
    "0 1 2 3 4 5 6 7 8 9 10 100 1000"
)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    return tok


def tiny_config(vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "float32",
    }


def random_state_dict(config: LlamaConfig, seed: int) -> dict[str, torch.Tensor]:
    """Weights drawn in a fixed order from one generator (norms are ones)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()}
    state = {}
    for name in sorted(shapes):
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shapes[name])
        else:
            # A wider spread than the usual 0.02 keeps greedy choices away from ties.
            state[name] = torch.randn(shapes[name], generator=gen) * 0.2
    return state


def build_tiny_random(dest: Path, seed: int = 0,
                      shape: dict[str, Any] | None = None) -> None:
    """``shape`` overrides config fields: a random model with a real model's dimensions
    (benchmarks/gpu_check.py) costs what that model costs, without its weights."""
    dest.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(dest / "tokenizer.json"))
    raw = {**tiny_config(tok.get_vocab_size()), **(shape or {})}
    raw["eos_token_id"] = tok.token_to_id("<|im_end|>")
    raw["bos_token_id"] = tok.token_to_id("<|endoftext|>")
    (dest / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    state = random_state_dict(LlamaConfig.from_hf(raw), seed)
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
