"""Greedy, temperature, top-k and top-p sampling, reproducible per request.

Logit bias and penalties (``penalties.py``) come first, on a copy of the logits.

A seeded request draws its n-th token from a generator seeded by (seed, n), so its tokens
do not depend on which other requests share the batch, on how its prompt was chunked, or
on whether it was preempted and recomputed in between. Unseeded requests share one
generator seeded at start-up. The sampler therefore keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slopilot.engine.executors.kernels import TorchKernels
from slopilot.engine.executors.penalties import (
    Bias,
    bias_tensors,
    needs_processing,
    process_row,
)
from slopilot.engine.request import SamplingParams

_MASK64 = (1 << 64) - 1


def _mix(seed: int, step: int) -> int:
    """SplitMix64 of (seed, step): neighbouring steps get unrelated generator seeds."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p on one row; removed entries become -inf."""
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens strictly above it already reach top_p; the most
        # likely token always stays.
        drop_sorted = probs.cumsum(-1) - probs >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu",
                 kernels: TorchKernels | None = None) -> None:
        self.device = torch.device(device)
        # Greedy rows take their argmax from the executor's kernels (native on CPU).
        self.kernels = kernels or TorchKernels()
        self._shared = torch.Generator(device=self.device)
        self._shared.manual_seed(seed)
        # The logit biases of the requests in the last step, by their params' identity
        # (the params object stays with its request, choices of one request share it):
        # built once per request, dropped the first step the request is not in.
        self._biases: dict[int, tuple[SamplingParams, Bias]] = {}

    def _generator(self, params: SamplingParams, num_output_tokens: int) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = torch.Generator(device=self.device)
        gen.manual_seed(_mix(params.seed, num_output_tokens))
        return gen

    def _step_biases(self, params: Sequence[SamplingParams]) -> dict[int, Bias]:
        kept: dict[int, tuple[SamplingParams, Bias]] = {}
        for p in params:
            if not p.logit_bias or id(p) in kept:
                continue
            known = self._biases.get(id(p))
            # The object is held in the entry, so its id cannot pass to another while kept.
            kept[id(p)] = known if known is not None and known[0] is p \
                else (p, bias_tensors(p, self.device))
        self._biases = kept
        return {key: bias for key, (_, bias) in kept.items()}

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               num_output_tokens: Sequence[int],
               histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None
               ) -> list[int]:
        """One token per row of float logits [rows, vocab].

        ``histories`` holds each row's (prompt ids, output ids), needed by penalties;
        ``logits`` itself is left as it is (the raw logits give the logprobs).
        """
        if logits.shape[0] != len(params) or len(params) != len(num_output_tokens):
            raise ValueError(
                f"{logits.shape[0]} logit rows for {len(params)} sampling params and "
                f"{len(num_output_tokens)} output counts; they must match")
        if not len(params):
            return []
        rows = [i for i, p in enumerate(params) if needs_processing(p)]
        if rows:
            if histories is None:
                raise ValueError("penalties need each row's prompt and output token ids; "
                                 "pass histories")
            logits = logits.float().clone()
            biases = self._step_biases([params[i] for i in rows])
            for i in rows:
                logits[i] = process_row(logits[i], params[i], *histories[i],
                                        bias=biases.get(id(params[i])))
        chosen = self.kernels.argmax(logits)
        drawn: list[tuple[int, torch.Tensor]] = []
        for i, (p, n_out) in enumerate(zip(params, num_output_tokens, strict=True)):
            if p.temperature == 0.0 or p.top_k == 1:
                continue
            probs = filter_logits(logits[i].float(), p).softmax(-1)
            # Exponential race (Gumbel-max in disguise): argmax(p / E) with E ~ Exp(1) is
            # a draw from p, and needs one random vector instead of a CDF search.
            noise = torch.empty_like(probs).exponential_(generator=self._generator(p, n_out))
            drawn.append((i, (probs / noise).argmax()))
        if drawn:
            # One host read for every row, not one per sampled row: on a GPU each read
            # waits for the device, and a batch of sampled rows paid that wait per row.
            where = torch.tensor([i for i, _ in drawn], device=chosen.device)
            chosen = chosen.index_copy(0, where, torch.stack([t for _, t in drawn])
                                       .to(chosen.dtype))
        return [int(t) for t in chosen.tolist()]
