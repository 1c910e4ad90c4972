"""A Llama-family decoder (Llama, Qwen2, SmolLM) over a flat token list and a paged KV cache.

Every linear layer runs once over all tokens of the iteration (prefill chunks and decodes
concatenated), which is what makes continuous batching pay; only attention looks at
sequences one by one (prefill chunks) or as a padded group (single-token rows). Each
layer adds its residual inside the output projection's GEMM and rotates queries and
keys in one pass (``kernels.py``): at decode's batch sizes a CPU spends as much time on
small ops as on the matmuls, so the layer is written in as few torch calls as it can.
Parameter names follow Hugging Face's, so a checkpoint's state dict loads as it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from slopilot.engine.executors.batch import AttentionBatch
from slopilot.engine.executors.kernels import Projection, Rope, TorchKernels, rms_norm
from slopilot.engine.executors.kv_cache import PagedKVCache

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The subset of a Hugging Face config.json the model needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hugging Face's rope parameters without rope_theta: {"rope_type": ..., "factor": ...}.
    rope_scaling: Mapping[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    # Qwen2 has biases on q/k/v projections; Llama may (attention_bias).
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; the checkpoint's "
                "config.json is inconsistent")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> LlamaConfig:
        """Build from a config.json dict, old (rope_scaling) or new (rope_parameters) style."""
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        # Old configs spell the type "type"; both mean the same.
        rope["rope_type"] = rope.pop("type", None) or rope.get("rope_type") or "default"
        arch = (cfg.get("architectures") or [""])[0]
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch.startswith("Qwen2") or bool(cfg.get("attention_bias", False)),
        )


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies as Hugging Face computes them (float32), scaling included."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (
        torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    params = config.rope_scaling
    rope_type = params.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        factor = float(params["factor"])
        low = float(params["low_freq_factor"])
        high = float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What every layer of one iteration shares, built once before the first layer."""

    rope: Rope
    batch: AttentionBatch
    cache: PagedKVCache
    # The non-GEMM ops: torch's, or the fused CPU library's (native_kernels.py).
    ops: TorchKernels
    # Additive [decodes, 1, 1, width] mask for the padded decode rows (0 or -inf), or
    # None when every decode row has the same context length.
    decode_bias: torch.Tensor | None
    # True when every row is a decode: attention output needs no scatter into place.
    decode_only: bool


def _not_fused(module: str) -> RuntimeError:
    return RuntimeError(f"{module} runs only after LlamaForCausalLM.to_runtime() fused "
                        "its projections; call model.to_runtime(device, dtype) first")


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_out, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_out, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_out, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_out, config.hidden_size, bias=False)
        self._split = (q_out, kv_out, kv_out)
        self.qkv: Projection | None = None
        self.out: Projection | None = None

    def fuse(self) -> None:
        """One [q; k; v] projection: one large matmul beats three small ones on CPU and GPU.

        The separate projections become views into the fused tensor, so the checkpoint's
        names still resolve and no weight is stored twice.
        """
        projs = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight.detach() for p in projs])
        for p, w in zip(projs, weight.split(self._split), strict=True):
            p.weight = nn.Parameter(w, requires_grad=False)
        bias = None
        if self.q_proj.bias is not None:
            bias = torch.cat([p.bias.detach() for p in projs])
            for p, b in zip(projs, bias.split(self._split), strict=True):
                p.bias = nn.Parameter(b, requires_grad=False)
        self.qkv = Projection(weight, bias)
        self.out = Projection(self.o_proj.weight.detach(), None)

    def forward(self, x: torch.Tensor, step: StepInputs, residual: torch.Tensor) -> torch.Tensor:
        """``residual + o_proj(attention(x))``."""
        q, k, v = self.project(x, step)
        return self.output(self.attend(q, k, v, step), residual)

    def project(self, x: torch.Tensor, step: StepInputs
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x``, rotated; the keys and values written to the
        cache at ``step.batch.slot_mapping``."""
        if self.qkv is None:
            raise _not_fused("Attention")
        n = x.shape[0]
        heads, kv_heads, hd = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x)
        q_out, kv_out, _ = self._split
        # Queries and keys rotate together: one set of calls for both.
        ops = step.ops
        qk = ops.rotate(qkv[:, :q_out + kv_out].view(n, heads + kv_heads, hd),
                        step.rope.cos, step.rope.signed_sin)
        q, k = qk.split((heads, kv_heads), dim=1)
        v = qkv[:, q_out + kv_out:].view(n, kv_heads, hd)
        k_flat, v_flat = step.cache.flat(self.layer_idx)
        ops.write_kv(k_flat, v_flat, step.batch.slot_mapping, k, v)
        return q, k, v

    def output(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + o_proj(attended)``, ``attended`` [tokens, heads, head_dim]."""
        if self.out is None:
            raise _not_fused("Attention")
        n = attended.shape[0]
        return self.out(attended.reshape(n, self.num_heads * self.head_dim), residual)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: StepInputs,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Every row's attention over its cached context: [tokens, heads, head_dim], in
        ``out`` when given (a static buffer a captured graph reads)."""
        n, heads, hd = q.shape[0], self.num_heads, self.head_dim
        ops, batch = step.ops, step.batch
        k_flat, v_flat = step.cache.flat(self.layer_idx)
        if step.decode_only:
            flat = ops.decode_attention(q, k_flat, v_flat, batch.single_slots,
                                        batch.single_lengths, step.decode_bias)
            return flat if out is None else out.copy_(flat)
        if out is None:
            out = torch.empty(n, heads, hd, dtype=q.dtype, device=q.device)
        if batch.single_rows is not None:
            rows = batch.single_rows
            out[rows] = ops.decode_attention(q.index_select(0, rows), k_flat, v_flat,
                                             batch.single_slots, batch.single_lengths,
                                             step.decode_bias)
        for chunk in batch.chunks:
            if chunk.mask is None:
                # A chunk from position 0 attends to its own tokens only: they are the
                # keys and values just computed, so nothing needs gathering.
                kk = k[chunk.begin:chunk.end].transpose(0, 1)
                vv = v[chunk.begin:chunk.end].transpose(0, 1)
            else:
                kk = k_flat.index_select(0, chunk.ctx_slots).transpose(0, 1)
                vv = v_flat.index_select(0, chunk.ctx_slots).transpose(0, 1)
            qq = q[chunk.begin:chunk.end].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=chunk.mask, is_causal=chunk.mask is None,
                enable_gqa=True)
            out[chunk.begin:chunk.end] = o.transpose(0, 1)
        return out


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up: Projection | None = None
        self.down: Projection | None = None

    def fuse(self) -> None:
        """One [gate; up] projection (see ``Attention.fuse``)."""
        weight = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])
        gate, up = weight.chunk(2)
        self.gate_proj.weight = nn.Parameter(gate, requires_grad=False)
        self.up_proj.weight = nn.Parameter(up, requires_grad=False)
        self.gate_up = Projection(weight, None, swiglu=True)
        self.down = Projection(self.down_proj.weight.detach(), None)

    def forward(self, x: torch.Tensor, residual: torch.Tensor,
                ops: TorchKernels) -> torch.Tensor:
        """``residual + down(silu(gate(x)) * up(x))``."""
        if self.gate_up is None or self.down is None:
            raise _not_fused("MLP")
        return self.down(ops.swiglu(self.gate_up, x), residual)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, step: StepInputs) -> torch.Tensor:
        q, k, v = self.before_attention(h, step)
        return self.after_attention(self.self_attn.attend(q, k, v, step), h, step.ops)

    def before_attention(self, h: torch.Tensor, step: StepInputs
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's work up to attention: its queries, keys and values (cached)."""
        norm = self.input_layernorm
        return self.self_attn.project(step.ops.rms_norm(h, norm.weight, norm.eps), step)

    def after_attention(self, attended: torch.Tensor, h: torch.Tensor,
                        ops: TorchKernels) -> torch.Tensor:
        """The layer's work after attention: the layer's output from ``h``, its input."""
        h = self.self_attn.output(attended, residual=h)
        norm = self.post_attention_layernorm
        return self.mlp(ops.rms_norm(h, norm.weight, norm.eps), residual=h, ops=ops)


class LlamaBody(nn.Module):
    """Hugging Face's ``model.`` prefix: embeddings, layers, final norm."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.head: Projection | None = None
        # TorchExecutor swaps in the native CPU kernels where they load.
        self.ops = TorchKernels()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                cache: PagedKVCache, logits_rows: torch.Tensor) -> torch.Tensor:
        """Float32 logits [len(logits_rows), vocab] for the chosen rows of the flat batch."""
        h = self.model.embed_tokens(input_ids)
        return self._layers_and_head(h, positions, batch, cache,
                                     self.decode_bias(batch, h.dtype), logits_rows)

    def decode_bias(self, batch: AttentionBatch, dtype: torch.dtype) -> torch.Tensor | None:
        """The padding mask of the batch's decode rows, once per pass (None: no decodes,
        or none padded)."""
        if batch.single_rows is None:
            return None
        return self.ops.decode_bias(batch.single_lengths, batch.single_slots.shape[1], dtype)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       batch: AttentionBatch, cache: PagedKVCache) -> torch.Tensor:
        """Float32 logits [rows, vocab] of a batch of single-token rows only, every row's.

        The same computation as ``forward`` without one host synchronisation or
        data-dependent shape, so a CUDA graph can capture it: the padding mask is always
        built and every row gets its logits.
        """
        h = self.model.embed_tokens(input_ids)
        bias = self.ops.decode_bias(batch.single_lengths, batch.single_slots.shape[1],
                                    h.dtype, static=True)
        return self._layers_and_head(h, positions, batch, cache, bias, None)

    def _layers_and_head(self, h: torch.Tensor, positions: torch.Tensor,
                         batch: AttentionBatch, cache: PagedKVCache,
                         bias: torch.Tensor | None,
                         logits_rows: torch.Tensor | None) -> torch.Tensor:
        ops = self.ops
        step = StepInputs(rope=Rope.at(positions, self.inv_freq, h.dtype), batch=batch,
                          cache=cache, ops=ops, decode_bias=bias, decode_only=not batch.chunks)
        for layer in self.model.layers:
            h = layer(h, step)
        norm = self.model.norm
        h = ops.rms_norm(h if logits_rows is None else h[logits_rows], norm.weight, norm.eps)
        return self.head_logits(h)

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden states the final norm has seen."""
        head = self.head if self.head is not None else Projection(self.lm_head.weight, None)
        return head(normed).float()

    def projections(self) -> list[Projection]:
        """The fused projections in the order a step runs them: per layer qkv, o, gate_up
        and down, then the head."""
        found: list[Projection | None] = []
        for layer in cast(Iterable[DecoderLayer], self.model.layers):
            found += [layer.self_attn.qkv, layer.self_attn.out, layer.mlp.gate_up,
                      layer.mlp.down]
        found.append(self.head)
        projs = [p for p in found if p is not None]
        if len(projs) != len(found):
            raise _not_fused("LlamaForCausalLM")
        return projs

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
        """Move weights to device and dtype, keeping the RoPE frequencies in float32."""
        # Re-tie first: loading with assign=True replaces the embedding parameter only.
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = rope_inv_freq(self.config)
        self.to(device=device, dtype=dtype)
        self.inv_freq = rope_inv_freq(self.config).to(device)
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse()
        self.head = Projection(self.lm_head.weight.detach(), None)
        self.eval()
        return self
