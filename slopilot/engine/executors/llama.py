"""A Llama-family decoder (Llama, Qwen2, SmolLM) over a flat token list and a paged KV cache.

Every linear layer runs once over all tokens of the iteration (prefill chunks and decodes
concatenated), which is what makes continuous batching pay; only attention looks at
sequences one by one (prefill chunks) or as a padded group (single-token rows).
Parameter names follow Hugging Face's, so a checkpoint's state dict loads as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from slopilot.engine.executors.batch import AttentionBatch
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
        # Normalise in float32 whatever the model dtype, as the reference does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Projection:
    """``x @ weight.T + bias`` for the runtime, in the fastest layout the device has.

    On CPU the weight is also kept prepacked in oneDNN's blocked layout (the kernel
    torch's own compiler uses for CPU linears): decode reads every weight once per
    iteration from DRAM, and the packed kernel does SmolLM2's projections at 24 rows in
    about 0.7x the time of the plain GEMM. The plain parameters stay for state_dict and
    the reference path, so CPU weights live twice; fine for the small models a CPU serves.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self._packed: torch.Tensor | None = None
        if weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) \
                and torch.backends.mkldnn.is_available() \
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            # The batch-size hint only picks the blocking; any row count works after.
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None and x.dim() == 2 and x.shape[0] > 0:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), self._packed, self.bias, "none", [], "")
            return out
        return F.linear(x, self.weight, self.bias)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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

    def _single_token_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                mask: torch.Tensor) -> torch.Tensor:
        """q [D, H, hd]; k, v [D, L, KVH, hd]; mask [D, L]. Returns [D, H, hd].

        Plain batched matmuls: for one query per row they beat the CPU flash kernel, and
        grouping the query heads per KV head avoids repeating K and V in memory.
        """
        d = q.shape[0]
        group = self.num_heads // self.num_kv_heads
        qg = q.view(d, self.num_kv_heads, group, self.head_dim)
        scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * self.head_dim ** -0.5
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        probs = scores.float().softmax(-1).to(v.dtype)
        out = torch.matmul(probs, v.transpose(1, 2))
        return out.reshape(d, self.num_heads, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: AttentionBatch, cache: PagedKVCache) -> torch.Tensor:
        n = x.shape[0]
        if self.qkv is not None:
            qf, kf, vf = self.qkv(x).split(self._split, -1)
        else:
            qf, kf, vf = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = qf.reshape(n, self.num_heads, self.head_dim)
        k = kf.reshape(n, self.num_kv_heads, self.head_dim)
        v = vf.reshape(n, self.num_kv_heads, self.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        cache.write(self.layer_idx, batch.slot_mapping, k, v)
        k_flat, v_flat = cache.flat(self.layer_idx)
        out = torch.empty_like(q)
        if batch.single_rows is not None:
            # Single-token rows (decodes): one padded call, queries [D, H, 1, hd].
            rows, slots, mask = batch.single_rows, batch.single_slots, batch.single_mask
            flat_slots = slots.flatten()
            kk = k_flat.index_select(0, flat_slots).view(*slots.shape, -1, self.head_dim)
            vv = v_flat.index_select(0, flat_slots).view(*slots.shape, -1, self.head_dim)
            out[rows] = self._single_token_attention(q.index_select(0, rows), kk, vv, mask)
        for chunk in batch.chunks:
            kk = k_flat.index_select(0, chunk.ctx_slots).transpose(0, 1)
            vv = v_flat.index_select(0, chunk.ctx_slots).transpose(0, 1)
            qq = q[chunk.begin:chunk.end].transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=chunk.mask, is_causal=chunk.mask is None,
                enable_gqa=True)
            out[chunk.begin:chunk.end] = o.transpose(0, 1)
        flat = out.reshape(n, self.num_heads * self.head_dim)
        return self.out(flat) if self.out is not None else self.o_proj(flat)


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
        self.gate_up = Projection(weight, None)
        self.down = Projection(self.down_proj.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None and self.down is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: AttentionBatch, cache: PagedKVCache) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, batch, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


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

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                cache: PagedKVCache, logits_rows: torch.Tensor) -> torch.Tensor:
        """Float32 logits [len(logits_rows), vocab] for the chosen rows of the flat batch."""
        h = self.model.embed_tokens(input_ids)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # [T, 1, head_dim]: broadcast over heads.
        cos = emb.cos().to(h.dtype).unsqueeze(1)
        sin = emb.sin().to(h.dtype).unsqueeze(1)
        for layer in self.model.layers:
            h = layer(h, cos, sin, batch, cache)
        h = self.model.norm(h[logits_rows])
        head = self.head if self.head is not None else self.lm_head
        return head(h).float()

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
