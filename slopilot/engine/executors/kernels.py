"""The forward pass's building blocks, each one torch call where torch has one.

A decode step of a small model is hundreds of small ops per layer; on a CPU each costs a
dispatch and often an allocation, so every block here does its job in as few torch
calls as the reference numerics allow (float32 results equal Hugging Face's formula
element for element, checked by tests/engine/test_kernels.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

# Every SDPA backend but cuDNN's, which builds an execution plan for each new shape: a
# served batch's shapes are new nearly every step (contexts grow, chunks vary), and on an
# H200 the plans cost 2 ms of host time per layer, a decode step 80 ms instead of 14.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                       SDPBackend.MATH]


def _onednn_linear_available() -> bool:
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


# Rows up to which the native small-batch GEMM beats oneDNN's packed one. A sweep of
# SmolLM2's gate_up shape with the weights streamed from DRAM (AVX-512 Xeon, 2 threads):
# ahead at 1-32 rows (176 against 144 GFLOP/s at 24), level at 48, behind from 64; both
# held to AVX2 on that CPU, level at 40.
SMALL_BATCH_ROWS = 40


def _onednn_bf16_available() -> bool:
    # oneDNN packs bfloat16 only with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere
    # (an AVX2 CPU) _reorder_linear_weight raises, and F.linear is the way.
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Projection:
    """``x @ weight.T + bias (+ residual)`` for the runtime, in the fastest layout the device has.

    On CPU the weight is also kept prepacked in oneDNN's blocked layout (the kernel
    torch's own compiler uses for CPU linears): at decode's 24 rows the packed kernel does
    SmolLM2's projections in about 0.7x the time of the plain GEMM, and a residual add
    runs as the GEMM's post-op instead of a pass of its own over the output. The plain
    parameters stay for state_dict, so CPU weights live twice; fine for the small
    models a CPU serves. Where the native AVX-512 or AVX2 kernels run, a third packing
    serves batches of at most ``SMALL_BATCH_ROWS`` rows (``use_small_batch_kernel``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *,
                 swiglu: bool = False) -> None:
        # swiglu: the output is [gate | up], SwiGLU's two halves (the MLP's fused one).
        self.weight, self.bias, self.swiglu = weight, bias, swiglu
        self._packed: torch.Tensor | None = None
        self._small: torch.Tensor | None = None
        if weight.device.type == "cpu" and _onednn_linear_available() and (
                weight.dtype == torch.float32
                or (weight.dtype == torch.bfloat16 and _onednn_bf16_available())):
            # The batch-size hint only picks the blocking; any row count works after.
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)

    @property
    def small_batch(self) -> bool:
        """Whether batches of up to ``SMALL_BATCH_ROWS`` rows run the native GEMM."""
        return self._small is not None

    def use_small_batch_kernel(self) -> None:
        """Pack the weight for ``torch.ops.slopilot.small_batch_linear`` as well.

        Only for a CPU float32 weight, and only once the native library is loaded (its
        AVX-512 or AVX2 build: the generic one refuses). A SwiGLU projection packs its two
        halves interleaved, so ``small_batch_swiglu`` can finish SwiGLU in the GEMM.
        """
        if self.weight.device.type != "cpu" or self.weight.dtype != torch.float32:
            raise ValueError(f"the small-batch GEMM is CPU float32 only, not "
                             f"{self.weight.device.type} {self.weight.dtype}")
        self._small = torch.ops.slopilot.pack_small_batch_weight(self.weight.detach(),
                                                                 self.swiglu)

    def _small_rows(self, x: torch.Tensor) -> bool:
        return (self._small is not None and x.dim() == 2
                and 0 < x.shape[0] <= SMALL_BATCH_ROWS and x.dtype == torch.float32)

    def small_batch_swiglu(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(gate) * up`` of this SwiGLU projection in one native call, where the
        small-batch kernel takes ``x``; None where it does not (the caller goes the long
        way: the projection, then ``silu_and_mul``)."""
        if not (self.swiglu and self.bias is None and self._small_rows(x)):
            return None
        out: torch.Tensor = torch.ops.slopilot.small_batch_swiglu(
            x.contiguous(), self._small, self.weight.shape[0] // 2)
        return out

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor
        if self._small_rows(x):
            out = torch.ops.slopilot.small_batch_linear(
                x.contiguous(), self._small, self.weight.shape[0], self.bias, residual)
            return out
        if self._packed is not None and x.dim() == 2 and x.shape[0] > 0:
            x = x.contiguous()
            if residual is not None:
                out = torch.ops.mkldnn._linear_pointwise.binary(
                    x, residual.contiguous(), self._packed, self.bias, "add")
            else:
                out = torch.ops.mkldnn._linear_pointwise(
                    x, self._packed, self.bias, "none", [], "")
            return out
        out = F.linear(x, self.weight, self.bias)
        return out if residual is None else out + residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps))``, normalised in float32 as the reference.

    One fused call in float32; in a 16-bit dtype the normalisation still runs in float32
    and is cast before the weight multiplies it, as Hugging Face's LlamaRMSNorm does.
    """
    shape = (x.shape[-1],)
    if x.dtype == torch.float32:
        return F.rms_norm(x, shape, weight, eps)
    return weight * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)


@dataclass(frozen=True, slots=True)
class Rope:
    """Rotary embedding tables for the positions of one iteration, shared by all layers.

    ``rotate_half(x) * sin`` is ``swap_halves(x) * [-sin, sin]``: the sign moves into the
    table once per iteration, so each layer rotates its queries and keys together in four
    calls with the reference's rounding (negation is exact).
    """

    cos: torch.Tensor          # [tokens, 1, head_dim]
    signed_sin: torch.Tensor   # [tokens, 1, head_dim], first half negated

    @classmethod
    def at(cls, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> Rope:
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()
        return cls(cos=emb.cos().to(dtype).unsqueeze(1), signed_sin=sin.to(dtype).unsqueeze(1))

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, head_dim] (any strides) -> a new contiguous rotated tensor."""
        return rotate(x, self.cos, self.signed_sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + swap_halves(x) * signed_sin`` (``Rope``'s tables) as a new tensor."""
    n, heads, dim = x.shape
    swapped = x.reshape(n, heads, 2, dim // 2).flip(2).view(n, heads, dim)
    swapped.mul_(signed_sin)
    out = x * cos
    return out.add_(swapped)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's ``silu(gate) * up`` from the fused [gate | up] projection output."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def decode_bias(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The padding of decode rows of ``lengths`` in ``width`` slots as SDPA's additive
    bias, once per iteration; None when no row is padded."""
    if bool((lengths == width).all()):
        return None
    return padding_bias(lengths, width, dtype)


def padding_bias(lengths: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """``decode_bias`` without asking whether any row is padded: no host synchronisation,
    so a CUDA graph can capture it (a captured batch is padded to its size anyway)."""
    mask = (torch.arange(width, device=lengths.device) < lengths[:, None])[:, None, None, :]
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, float("-inf"))


class TorchKernels:
    """A layer's non-GEMM ops in torch calls: any device, any dtype.

    ``native_kernels.NativeKernels`` overrides them with the fused CPU library; the
    model calls them through the iteration's ``StepInputs.ops`` and never asks which.
    """

    native = False

    def prepare(self, projections: Iterable[Projection]) -> None:
        """Ready the model's projections for these kernels, once, after fusing.

        torch's ops need nothing; ``NativeKernels`` packs them for its small-batch GEMM.
        """

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(gate_up)

    def swiglu(self, gate_up: Projection, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the MLP's fused projection over ``x``."""
        return self.silu_and_mul(gate_up(x))

    def rotate(self, x: torch.Tensor, cos: torch.Tensor,
               signed_sin: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, head_dim] rotated: a new tensor (the native op rotates x)."""
        return rotate(x, cos, signed_sin)

    def write_kv(self, k_flat: torch.Tensor, v_flat: torch.Tensor, slots: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor) -> None:
        k_flat.index_copy_(0, slots, k)
        v_flat.index_copy_(0, slots, v)

    def decode_bias(self, lengths: torch.Tensor, width: int, dtype: torch.dtype, *,
                    static: bool = False) -> torch.Tensor | None:
        """The padding mask of the decode rows (``decode_bias``); ``static``: always
        built, never asked for (a CUDA graph's capture allows no host synchronisation)."""
        if static:
            return padding_bias(lengths, width, dtype)
        return decode_bias(lengths, width, dtype)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's first largest entry (the first NaN, if any), as ``argmax(-1)``."""
        return logits.argmax(-1)

    def decode_attention(self, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
                         slots: torch.Tensor, lengths: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
        """Single-token rows in one padded SDPA call. q [D, H, hd] -> [D, H, hd].

        Keys and values are gathered by slot into [D, width, KVH, hd] and read through a
        transposed view (SDPA takes any strides, so no copy). The query heads of one KV
        head become that head's query rows ([D, KVH, group, hd]): the CPU flash kernel
        then tiles three queries per key block instead of one, and K and V are never
        repeated per query head. ``lengths`` is unused: ``bias`` masks the padding.
        """
        d, width = slots.shape
        heads, head_dim = q.shape[1], q.shape[2]
        kv_heads = k_flat.shape[1]
        flat_slots = slots.view(-1)
        kk = k_flat.index_select(0, flat_slots).view(d, width, kv_heads, -1)
        vv = v_flat.index_select(0, flat_slots).view(d, width, kv_heads, -1)
        qg = q.reshape(d, kv_heads, heads // kv_heads, head_dim)
        out = F.scaled_dot_product_attention(qg, kk.transpose(1, 2), vv.transpose(1, 2),
                                             attn_mask=bias)
        # reshape, not view: CUDA's fused kernels hand back a transposed [D, group, KVH,
        # hd] buffer, which one copy puts in the head order the projection expects.
        return out.reshape(d, heads, head_dim)
