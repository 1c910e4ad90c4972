"""Passes with prefill chunks, each layer's work around attention replayed from CUDA graphs.

A decode-only pass is one graph (``decode_graphs.py``); a pass with a prefill chunk cannot
be: its attention depends on how many chunks it holds and how long each is. Everything
else in it (the embedding, the norms, the projections, RoPE, the KV writes, the MLP)
depends only on how many tokens it holds. So such a pass runs as ``layers + 1`` pieces
captured per padded token count, with each layer's attention eager between them, as
vLLM's piecewise CUDA graphs split it::

    piece 0        embed, RoPE tables, layer 0 up to attention  -> q, k, v (cached)
    attention 0    eager: the decode rows' batched call, one call per chunk
    piece i        layer i-1 after attention, layer i up to attention
    ...
    piece L        layer L-1 after attention, the final norm
    head           eager, on the rows that sample (or want prompt logprobs)

On the H200 of docs/benchmarks.md such a pass launched 1,373 kernels at 10-40 us of
host time each; here it launches ``L + 1`` graphs and the attention's few kernels per
layer and chunk. The pieces read and write static buffers sized for the largest bucket
(token ids, positions, new slots, hidden states, q, k, v, RoPE tables, the attention's
output), so every bucket's graphs share them and one memory pool. Padding tokens (up to
the bucket) decode token 0 at position 0 into the cache's scratch block and are never
read: the eager attention sees only the real tokens. Off by default (``--piecewise-graphs
cuda`` turns it on): measured on a GPU it becomes the default, as the decode graphs did.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch.nn.attention import sdpa_kernel

from slopilot.engine.executors.batch import AttentionBatch, FlatBatch
from slopilot.engine.executors.decode_graphs import Capture, Replay, eager_capture
from slopilot.engine.executors.graph_shapes import batch_buckets
from slopilot.engine.executors.kernels import ATTENTION_BACKENDS, Rope
from slopilot.engine.executors.kv_cache import PagedKVCache
from slopilot.engine.executors.llama import DecoderLayer, LlamaForCausalLM, StepInputs

# Largest pass captured, in tokens: a token budget's worth (larger passes run eagerly).
DEFAULT_MAX_TOKENS = 8192


class PiecewiseGraphError(ValueError):
    """A piecewise-graph setting that cannot work; the message names it and the fix."""


@dataclass(slots=True)
class _Pieces:
    tokens: int
    replays: list[Replay]
    # Kept for as long as the graphs: a CUDA graph reads what its computation closed over
    # by address and does not keep it.
    runs: list[Callable[[], torch.Tensor]]


class PiecewiseGraphs:
    """Passes of up to ``max_tokens`` tokens as per-layer piece replays (module docstring)."""

    def __init__(self, model: LlamaForCausalLM, cache: PagedKVCache, *, capture: Capture,
                 max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if cache.scratch_blocks < 1:
            raise PiecewiseGraphError(
                "the KV cache has no scratch block for padding tokens; build it with "
                "PagedKVCache(scratch_blocks=1)")
        if max_tokens < 1:
            raise PiecewiseGraphError(f"max_graph_tokens={max_tokens}: must be >= 1")
        self.model, self.cache = model, cache
        self._capture = capture
        # Whether the capture makes real CUDA graphs (and not ``eager_capture``'s passes).
        self.captures_graphs = capture is not eager_capture
        self.buckets = batch_buckets(max_tokens)
        self._pieces: dict[int, _Pieces] = {}
        cfg = model.config
        t, device = self.buckets[-1], cache.gpu.device
        dtype = model.lm_head.weight.dtype
        hd, heads, kv_heads = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

        def zeros(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
            # Zeros, not empty: padding rows only ever hold finite values.
            return torch.zeros(*shape, dtype=kind, device=device)

        self._ids, self._positions = zeros(t, kind=torch.long), zeros(t, kind=torch.long)
        self._slots = torch.full((t,), cache.scratch_slot, dtype=torch.long, device=device)
        self._h, self._normed = zeros(t, cfg.hidden_size), zeros(t, cfg.hidden_size)
        self._q, self._attended = zeros(t, heads, hd), zeros(t, heads, hd)
        self._k, self._v = zeros(t, kv_heads, hd), zeros(t, kv_heads, hd)
        self._cos, self._sin = zeros(t, 1, hd), zeros(t, 1, hd)

    @property
    def captured(self) -> list[int]:
        """The token counts whose pieces are captured."""
        return list(self._pieces)

    def bucket_for(self, tokens: int) -> int | None:
        """The padded token count ``tokens`` run at, or None (too many: eager)."""
        return next((b for b in self.buckets if b >= tokens), None) if tokens else None

    def capture_all(self, max_tokens: int) -> int:
        """Capture every bucket a pass of up to ``max_tokens`` tokens can run as, largest
        first; returns how many were new (a budget raised later captures lazily)."""
        top = self.bucket_for(min(max(max_tokens, 1), self.buckets[-1]))
        new = 0
        for bucket in reversed([b for b in self.buckets if top is not None and b <= top]):
            if bucket not in self._pieces:
                self._pieces[bucket] = self._capture_pieces(bucket)
                new += 1
        return new

    def run(self, batch: FlatBatch) -> torch.Tensor:
        """Float32 logits of ``batch.logits_rows``, as the eager ``model(...)`` gives them.

        Call inside ``torch.inference_mode()`` and the executor's attention backends.
        """
        n = batch.input_ids.shape[0]
        bucket = self.bucket_for(n)
        if bucket is None:
            raise PiecewiseGraphError(f"{n} tokens do not fit a piecewise graph; ask "
                                      "bucket_for() first")
        pieces = self._pieces.get(bucket)
        if pieces is None:
            pieces = self._pieces[bucket] = self._capture_pieces(bucket)
        self._stage(batch, n, bucket)
        model, ops = self.model, self.model.ops
        attention = batch.attention
        rope = Rope(self._cos[:n], self._sin[:n])
        step = StepInputs(rope=rope, batch=attention, cache=self.cache, ops=ops,
                          decode_bias=model.decode_bias(attention, self._q.dtype),
                          decode_only=not attention.chunks)
        layers = self._layers()
        pieces.replays[0]()
        for i, layer in enumerate(layers):
            layer.self_attn.attend(self._q[:n], self._k[:n], self._v[:n], step,
                                   out=self._attended[:n])
            pieces.replays[i + 1]()
        return model.head_logits(self._normed[:n].index_select(0, batch.logits_rows))

    def _layers(self) -> list[DecoderLayer]:
        return cast(list[DecoderLayer], list(self.model.model.layers))

    def _stage(self, batch: FlatBatch, n: int, bucket: int) -> None:
        self._ids[:n].copy_(batch.input_ids)
        self._positions[:n].copy_(batch.positions)
        self._slots[:n].copy_(batch.attention.slot_mapping)
        if bucket > n:
            self._ids[n:bucket].zero_()
            self._positions[n:bucket].zero_()
            self._slots[n:bucket].fill_(self.cache.scratch_slot)

    def _capture_pieces(self, tokens: int) -> _Pieces:
        model, cache, ops = self.model, self.cache, self.model.ops
        layers = self._layers()
        b = tokens
        ids, positions, slots = self._ids[:b], self._positions[:b], self._slots[:b]
        h, normed = self._h[:b], self._normed[:b]
        q, k, v, attended = self._q[:b], self._k[:b], self._v[:b], self._attended[:b]
        cos, sin = self._cos[:b], self._sin[:b]
        # Captured over padding only: the warm-up passes and the captures write the
        # scratch block, never a request's blocks.
        ids.zero_()
        positions.zero_()
        slots.fill_(cache.scratch_slot)
        step = StepInputs(rope=Rope(cos, sin), batch=AttentionBatch(slot_mapping=slots),
                          cache=cache, ops=ops, decode_bias=None, decode_only=False)

        def up_to_attention(layer: DecoderLayer) -> None:
            qq, kk, vv = layer.before_attention(h, step)
            q.copy_(qq)
            k.copy_(kk)
            v.copy_(vv)

        def first() -> torch.Tensor:
            h.copy_(model.model.embed_tokens(ids))
            rope = Rope.at(positions, model.inv_freq, h.dtype)
            cos.copy_(rope.cos)
            sin.copy_(rope.signed_sin)
            up_to_attention(layers[0])
            return h

        def middle(done: DecoderLayer, nxt: DecoderLayer) -> Callable[[], torch.Tensor]:
            def piece() -> torch.Tensor:
                h.copy_(done.after_attention(attended, h, ops))
                up_to_attention(nxt)
                return h
            return piece

        def last() -> torch.Tensor:
            h.copy_(layers[-1].after_attention(attended, h, ops))
            norm = model.model.norm
            normed.copy_(ops.rms_norm(h, norm.weight, norm.eps))
            return normed

        runs = [first, *(middle(a, z) for a, z in itertools.pairwise(layers)),
                last]
        replays: list[Replay] = []
        # The executor's attention backends: a capture fixes the choice for good.
        with torch.inference_mode(), sdpa_kernel(ATTENTION_BACKENDS):
            for run in runs:
                replay, _ = self._capture(run)
                replays.append(replay)
        return _Pieces(tokens, replays, runs)
