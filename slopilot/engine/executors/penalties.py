"""Logit bias and the three penalties, applied to a row's logits before sampling.

The order is vLLM's (and transformers' for the two it has): bias, then the repetition
penalty over prompt and output tokens, then frequency and presence over output tokens::

    logits[t] += logit_bias[t]
    logits[t]  = logits[t] / r  if logits[t] > 0 else logits[t] * r   (t seen anywhere)
    logits[t] -= frequency * count_out[t] + presence * (count_out[t] > 0)

Greedy requests get them too: a penalty that changes the argmax is the point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slopilot.engine.request import SamplingParams


def needs_processing(params: SamplingParams) -> bool:
    return bool(params.logit_bias) or params.has_penalties


def process_row(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                output_ids: Sequence[int]) -> torch.Tensor:
    """A new float32 row: ``logits`` [vocab] with bias and penalties applied."""
    row = logits.float().clone()
    vocab = row.shape[-1]
    device = row.device
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long, device=device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=row.dtype, device=device)
        row.index_add_(0, ids, bias)
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long,
                            device=device).unique()
        if seen.numel():
            picked = row[seen]
            penalty = params.repetition_penalty
            row[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    if (params.frequency_penalty != 0.0 or params.presence_penalty != 0.0) and output_ids:
        out = torch.tensor(list(output_ids), dtype=torch.long, device=device)
        counts = torch.bincount(out, minlength=vocab)[:vocab].to(row.dtype)
        row -= params.frequency_penalty * counts
        row -= params.presence_penalty * (counts > 0).to(row.dtype)
    return row
