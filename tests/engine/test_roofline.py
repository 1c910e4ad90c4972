"""The decode step's FLOPs and bytes, its floors, and the ceiling measurements' plumbing."""

from __future__ import annotations

import pytest
import torch

from slopilot.engine.executors.kernels import TorchKernels
from slopilot.engine.executors.llama import LlamaConfig
from slopilot.engine.executors.native_kernels import NativeKernels
from slopilot.engine.executors.roofline import (
    Ceilings,
    Gemm,
    Roofline,
    ShapeRate,
    decode_step_cost,
    gemm_kernels,
    has_native_bf16,
    measure_gemm,
    measure_stream_bandwidth,
)

SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, tie_word_embeddings=True)


def test_smollm2_decode_step_cost() -> None:
    cost = decode_step_cost(SMOLLM2, batch=24, context=70)
    per_layer = 576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576
    params = 30 * per_layer + 576 * 49152
    assert sum(g.flops for g in cost.gemms) == 2 * 24 * params
    assert cost.attention_flops == 4 * 24 * 30 * 9 * 64 * 70
    # Every GEMM weight once in float32, plus the batch's embedding rows and the norms.
    assert cost.weight_bytes == 4 * (params + 24 * 576 + 61 * 576)
    assert cost.kv_bytes == 2 * 30 * 192 * 4 * 24 * 71
    assert 6.4e9 < cost.flops < 6.6e9


def _ceilings(flops_per_s: float, bytes_per_s: float) -> Ceilings:
    shapes = tuple(ShapeRate(g, flops_per_s, 2 * flops_per_s, "F.linear")
                   for g in decode_step_cost(SMOLLM2, 24, 70).gemms)
    return Ceilings(torch.float32, 2, shapes, bytes_per_s)


def test_the_binding_floor_and_the_fraction() -> None:
    cost = decode_step_cost(SMOLLM2, 24, 70)
    compute_bound = Roofline(cost, _ceilings(66e9, 21.5e9))
    assert compute_bound.bound == "compute"
    assert compute_bound.compute_floor_s == pytest.approx(cost.flops / 66e9)
    assert compute_bound.memory_floor_s == pytest.approx(cost.bytes / 21.5e9)
    assert compute_bound.fraction(2 * compute_bound.compute_floor_s) == pytest.approx(0.5)
    memory_bound = Roofline(cost, _ceilings(1e12, 5e9))
    assert memory_bound.bound == "memory"
    assert memory_bound.floor_s == memory_bound.memory_floor_s


def test_best_of_two_measurements_takes_each_shape_and_bandwidth_at_its_best() -> None:
    slow, fast = _ceilings(40e9, 20e9), _ceilings(60e9, 10e9)
    merged = slow.best_of(fast)
    assert merged.gemm_flops_per_s == 60e9
    assert merged.stream_bytes_per_s == 20e9


def test_bf16_is_native_only_with_avx512_bf16_or_amx() -> None:
    assert not has_native_bf16(("avx", "avx2", "fma", "f16c"))
    assert has_native_bf16(("avx512f", "avx512_bf16"))
    assert has_native_bf16(("amx_bf16", "amx_tile"))


def test_measurements_run_on_a_small_shape() -> None:
    """Plumbing only: small sizes, no claim about the speed."""
    rate = measure_gemm(Gemm("tiny", 4, 32, 48, 2), torch.float32, repeats=1,
                        stream_bytes=1 << 16)
    assert rate.streamed_flops_per_s > 0 and rate.in_cache_flops_per_s > 0
    assert rate.kernel in gemm_kernels()
    assert measure_stream_bandwidth(1 << 20, repeats=1) > 0


def test_the_engines_own_gemm_is_among_the_kernels_measured() -> None:
    # The floor is the best rate of any kernel on offer, the engine's own included: a
    # faster engine GEMM lowers the floor it is judged against rather than escaping it.
    assert list(gemm_kernels()) == ["engine projection", "torch.matmul", "F.linear"]
    native = gemm_kernels(NativeKernels("avx512"))
    assert list(native) == ["engine projection", "oneDNN projection", "torch.matmul",
                            "F.linear"]
    assert list(gemm_kernels(TorchKernels())) == list(gemm_kernels())
