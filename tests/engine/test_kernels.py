"""The forward pass's fused blocks give the reference formulas' numbers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from slopilot.engine.executors.kernels import Projection, Rope, rms_norm, silu_and_mul
from slopilot.engine.executors.llama import Attention, LlamaConfig, rope_inv_freq


def _reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Hugging Face's LlamaRMSNorm.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 96, generator=gen) * 3).to(dtype)
    weight = torch.randn(96, generator=gen).to(dtype)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5), _reference_rms_norm(x, weight, 1e-5),
                               atol=0, rtol=0 if dtype == torch.float32 else 1e-2)


def test_rope_rotates_queries_and_keys_as_the_reference() -> None:
    cfg = LlamaConfig(vocab_size=10, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    positions = torch.tensor([0, 5, 6, 300])
    inv_freq = rope_inv_freq(cfg)
    # A strided view, as the layer passes the q/k columns of the fused projection.
    qkv = torch.randn(4, 7 * 16, generator=torch.Generator().manual_seed(1))
    qk = qkv[:, :6 * 16].view(4, 6, 16)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    expected = qk * cos + _rotate_half(qk) * sin
    got = Rope.at(positions, inv_freq, torch.float32).apply(qk)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert got.is_contiguous()


def test_projection_adds_the_residual_in_the_gemm() -> None:
    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    x, residual = torch.randn(5, 32, generator=gen), torch.randn(5, 48, generator=gen)
    proj = Projection(weight, bias)
    expected = F.linear(x, weight, bias)
    torch.testing.assert_close(proj(x), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(proj(x, residual), expected + residual, atol=1e-4, rtol=1e-4)
    # Zero rows (an iteration with nothing to sample) go through the plain path.
    assert proj(x[:0], residual[:0]).shape == (0, 48)


def test_silu_and_mul() -> None:
    gate_up = torch.randn(3, 20, generator=torch.Generator().manual_seed(3))
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, atol=0, rtol=0)


def test_an_unfused_layer_says_how_to_fix_it() -> None:
    cfg = LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    with pytest.raises(RuntimeError, match=r"call model.to_runtime\(device, dtype\) first"):
        Attention(cfg, 0)(torch.zeros(1, 8), None, torch.zeros(1, 8))  # type: ignore[arg-type]


def test_a_bfloat16_projection_runs_where_onednn_cannot_pack_bfloat16() -> None:
    # oneDNN packs bfloat16 only with AVX-512 or AVX-NE-CONVERT; held to AVX2 (as an AVX2
    # CPU is) the packing raised, and a bfloat16 engine could not load its weights.
    probe = ("import torch; from slopilot.engine.executors.kernels import Projection; "
             "w = torch.ones(8, 4, dtype=torch.bfloat16); "
             "print(Projection(w, None)(torch.ones(2, 4, dtype=torch.bfloat16)).sum().item())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=False, env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "64.0"


def test_decode_attention_takes_sdpa_output_in_any_layout(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """CUDA's flash and memory-efficient SDPA kernels return [B, H, L, E] as a transposed
    view of a [B, L, H, E] buffer; the grouped decode rows must not assume contiguity
    (H200: 'view size is not compatible with input tensor's size and stride')."""
    from slopilot.engine.executors import kernels

    torch.manual_seed(0)
    d, width, heads, kv_heads, hd = 3, 5, 6, 2, 8
    q = torch.randn(d, heads, hd)
    k_flat, v_flat = torch.randn(32, kv_heads, hd), torch.randn(32, kv_heads, hd)
    slots = torch.randint(0, 32, (d, width))
    lengths = torch.tensor([5, 3, 1])
    ops = kernels.TorchKernels()
    bias = ops.decode_bias(lengths, width, q.dtype)
    expected = ops.decode_attention(q, k_flat, v_flat, slots, lengths, bias)
    sdpa = F.scaled_dot_product_attention

    def strided_like_cuda(*args: torch.Tensor, **kw: object) -> torch.Tensor:
        out = sdpa(*args, **kw)  # type: ignore[arg-type]
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", strided_like_cuda)
    got = ops.decode_attention(q, k_flat, v_flat, slots, lengths, bias)
    torch.testing.assert_close(got, expected)
    assert got.view(d, heads * hd).shape == (d, heads * hd)
