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


Bias = tuple[torch.Tensor, torch.Tensor]


def bias_tensors(params: SamplingParams, device: torch.device) -> Bias:
    """A request's ``logit_bias`` as (token ids, float32 values) on ``device``."""
    ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long, device=device)
    values = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32,
                          device=device)
    return ids, values


def process_row(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                output_ids: Sequence[int], bias: Bias | None = None) -> torch.Tensor:
    """A new float32 row: ``logits`` [vocab] with bias and penalties applied.

    ``bias`` is ``bias_tensors(params)`` built once for the request (a client may send
    a bias for every token of the vocabulary); without it the row builds its own.
    """
    row = logits.float().clone()
    vocab = row.shape[-1]
    device = row.device
    if params.logit_bias:
        ids, values = bias if bias is not None else bias_tensors(params, device)
        row.index_add_(0, ids, values)
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
