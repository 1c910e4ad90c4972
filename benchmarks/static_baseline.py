"""Static batching through transformers' ``generate()``: the reference serving baseline.

Requests are cut into fixed batches, left-padded, and each batch runs to its longest
member before the next starts. The end-of-sequence token is handled as the engines do:

- by default generation stops at EOS (the EOS token is the last output token, as the
  engines and vLLM return it), and tokens/s counts the tokens actually generated;
- with ``ignore_eos`` generation runs past EOS to ``max_tokens`` without changing what is
  sampled, the way transformers ignores EOS: no EOS ids to stop on (``eos_token_id=[]``).
  ``min_new_tokens`` would be wrong here: it masks the EOS logit, so the greedy text
  after the point where the model wanted to end differs from every engine's.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class StaticResult:
    tokens_per_s: float
    elapsed_s: float
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    token_ids: dict[str, list[int]] = field(default_factory=dict)


def eos_ids(model: Any) -> list[int]:
    """Every id that ends generation for this model (generation config first)."""
    ids: list[int] = []
    for source in (model.generation_config.eos_token_id, model.config.eos_token_id):
        for tid in source if isinstance(source, list) else [source]:
            if isinstance(tid, int) and tid not in ids:
                ids.append(tid)
    return ids


def cut_at_eos(row: list[int], eos: list[int]) -> list[int]:
    """Tokens up to and including the first EOS (the rest is padding)."""
    for i, tid in enumerate(row):
        if tid in eos:
            return row[:i + 1]
    return row


def run_static(model_dir: Path, prompts: list[list[int]], max_tokens: int, batch: int,
               ignore_eos: bool) -> StaticResult:
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LogitsProcessor,
        LogitsProcessorList,
    )

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    eos = eos_ids(model)
    pad = eos[0] if eos else 0
    config = GenerationConfig(do_sample=False, max_new_tokens=max_tokens, pad_token_id=pad,
                              eos_token_id=[] if ignore_eos else eos)

    class Stamp(LogitsProcessor):  # called once per generated position
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.times.append(time.perf_counter())
            return scores

    result = StaticResult(tokens_per_s=0.0, elapsed_s=0.0)
    start = time.perf_counter()
    for b in range(0, len(prompts), batch):
        group = prompts[b:b + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        stamp = Stamp()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                 logits_processor=LogitsProcessorList([stamp]))
        # Every request of the batch waited for the batches before it.
        result.ttft_s += [stamp.times[0] - start] * len(group)
        result.gaps_s += [(y - x) for x, y in itertools.pairwise(stamp.times)] * len(group)
        for i, row in enumerate(out[:, width:].tolist()):
            result.token_ids[f"r{b + i}"] = row if ignore_eos else cut_at_eos(row, eos)
    result.elapsed_s = time.perf_counter() - start
    generated = sum(len(t) for t in result.token_ids.values())
    result.tokens_per_s = generated / result.elapsed_s
    return result
