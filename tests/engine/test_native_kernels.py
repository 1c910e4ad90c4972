"""The fused CPU kernels against the torch ops they replace, their errors, and their build.

The first test to ask for the library builds it (once per source and torch version, into
``$SLOPILOT_KERNEL_DIR`` or ~/.cache/slopilot/kernels; `make test` installs g++).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slopilot.engine.executors import native_kernels as nk
from slopilot.engine.executors.kernels import SMALL_BATCH_ROWS, Projection, Rope, TorchKernels
from slopilot.engine.executors.loader import LoadedModel, load_checkpoint
from slopilot.engine.executors.torch_runner import ExecutorError, TorchExecutor
from tests.engine.torch_driver import Plan, generate, greedy

CPU = torch.device("cpu")
REF = TorchKernels()


@pytest.fixture(scope="module")
def native() -> TorchKernels:
    choice = nk.choose_kernels("native", CPU, torch.float32)
    assert choice.native and isinstance(choice.kernels, nk.NativeKernels)
    return choice.kernels


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("cols", [576, 13, 8])
def test_rms_norm_matches_torch_on_contiguous_and_strided_rows(native: TorchKernels,
                                                                cols: int) -> None:
    wide = torch.randn(9, cols + 5, generator=_gen(0)) * 4
    x = wide[:, :cols]                      # rows with a stride longer than their length
    weight = torch.randn(cols, generator=_gen(1))
    got = native.rms_norm(x, weight, 1e-5)
    assert got.is_contiguous()
    # A sum of squares in another order: float32 rounding, not bit for bit.
    torch.testing.assert_close(got, REF.rms_norm(x, weight, 1e-5), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("inter", [1536, 40, 24, 20, 3])
def test_silu_and_mul_is_bit_for_bit_torch(native: TorchKernels, inter: int) -> None:
    gate_up = torch.randn(5, 2 * inter, generator=_gen(2)) * 6
    assert torch.equal(native.silu_and_mul(gate_up), REF.silu_and_mul(gate_up))


@pytest.mark.parametrize("head_dim", [64, 20])
def test_rotary_rotates_the_fused_projection_in_place_as_torch(native: TorchKernels,
                                                                head_dim: int) -> None:
    heads, kv_heads, tokens = 6, 2, 7
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=_gen(3))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    rope = Rope.at(torch.tensor([0, 1, 5, 6, 90, 300, 2047]), inv_freq, torch.float32)
    qk = qkv[:, :(heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    untouched = qkv[:, (heads + kv_heads) * head_dim:].clone()
    expected = REF.rotate(qk, rope.cos, rope.signed_sin)
    got = native.rotate(qk, rope.cos, rope.signed_sin)
    assert got.data_ptr() == qk.data_ptr()              # in place, in the projection
    assert torch.equal(got, expected)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim:], untouched)


@pytest.mark.parametrize("strided", [True, False])
def test_write_kv_puts_each_token_at_its_slot(native: TorchKernels, strided: bool) -> None:
    kv_heads, dim, tokens = 3, 16, 5
    qkv = torch.randn(tokens, (4 + 2 * kv_heads) * dim, generator=_gen(4))
    k = qkv[:, 4 * dim:(4 + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = qkv[:, (4 + kv_heads) * dim:].view(tokens, kv_heads, dim)
    if not strided:
        k, v = k.contiguous(), v.contiguous()
    else:
        # Heads apart from each other too: each head is copied on its own.
        k = k.transpose(0, 1).contiguous().transpose(0, 1)
    slots = torch.tensor([7, 0, 31, 8, 15])
    caches = [torch.full((32, kv_heads, dim), float("nan")) for _ in range(4)]
    native.write_kv(caches[0], caches[1], slots, k, v)
    REF.write_kv(caches[2], caches[3], slots, k, v)
    assert torch.equal(caches[0][slots], k) and torch.equal(caches[1][slots], v)
    torch.testing.assert_close(caches[0], caches[2], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(caches[1], caches[3], equal_nan=True, rtol=0, atol=0)


def test_argmax_answers_as_torch_on_ties_nans_infinities_and_odd_widths(
        native: TorchKernels) -> None:
    logits = torch.randn(8, 1003, generator=_gen(9)) * 5
    logits[1, 400:] = logits[1].max() + 1        # a tie: the first occurrence wins
    logits[2, 17] = logits[2, 900] = float("nan")  # the first NaN wins over any number
    logits[3] = float("-inf")                     # all masked: index 0, as torch
    logits[4, 5] = float("inf")
    logits[5, 1002] = 1e30                        # the maximum in the scalar tail
    logits[6] = 0.0
    for x in (logits, logits[:, :1001], logits[:, 3:]):   # strided rows, other tails
        assert torch.equal(native.argmax(x), REF.argmax(x))
    # What the sampler hands it on other paths: torch's own argmax answers.
    assert torch.equal(native.argmax(logits[0]), REF.argmax(logits[0]))
    assert torch.equal(native.argmax(logits.double()), REF.argmax(logits.double()))


def _decode_case(rows: int, heads: int, kv_heads: int, dim: int, lengths: list[int],
                 seed: int) -> tuple[torch.Tensor, ...]:
    gen = _gen(seed)
    capacity = 4 * sum(lengths) + 16
    k_cache = torch.randn(capacity, kv_heads, dim, generator=gen)
    v_cache = torch.randn(capacity, kv_heads, dim, generator=gen)
    width = max(lengths)
    perm = torch.randperm(capacity, generator=gen)
    slots = torch.empty(rows, width, dtype=torch.long)
    at = 0
    for i, n in enumerate(lengths):
        slots[i, :n] = perm[at:at + n]
        slots[i, n:] = slots[i, 0]           # the batch builder's padding
        at += n
    q = torch.randn(rows, heads, dim, generator=gen) * 2
    return q, k_cache, v_cache, slots, torch.tensor(lengths)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "lengths"), [
    (9, 3, 64, [72, 1, 17, 8, 9, 70, 33, 16]),   # SmolLM2's shape, ragged contexts
    (4, 4, 20, [5, 3, 9]),                      # no grouping, a head_dim off the lanes
    (8, 1, 128, [130, 7]),                      # one KV head for all, long context
])
def test_decode_attention_matches_masked_sdpa(native: TorchKernels, heads: int,
                                              kv_heads: int, dim: int,
                                              lengths: list[int]) -> None:
    q, k_cache, v_cache, slots, lens = _decode_case(len(lengths), heads, kv_heads, dim,
                                                    lengths, seed=5)
    expected = REF.decode_attention(q, k_cache, v_cache, slots, lens,
                                    REF.decode_bias(lens, slots.shape[1], torch.float32))
    got = native.decode_attention(q, k_cache, v_cache, slots, lens, None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-6)


def test_decode_attention_never_reads_past_a_rows_length(native: TorchKernels) -> None:
    q, k_cache, v_cache, slots, lens = _decode_case(3, 6, 2, 32, [4, 9, 2], seed=6)
    expected = native.decode_attention(q, k_cache, v_cache, slots, lens, None)
    # Padding pointing at poisoned or even invalid slots changes nothing.
    poisoned = slots.clone()
    for i, n in enumerate(lens.tolist()):
        poisoned[i, n:] = -1
    k_cache[slots.max() + 1:] = float("nan")
    assert torch.equal(native.decode_attention(q, k_cache, v_cache, poisoned, lens, None),
                       expected)


def test_decode_attention_reads_queries_through_the_projections_strides(
        native: TorchKernels) -> None:
    q, k_cache, v_cache, slots, lens = _decode_case(4, 6, 2, 16, [3, 8, 1, 5], seed=7)
    wide = torch.zeros(4, 10, 16)
    wide[:, :6] = q
    view = wide[:, :6]                       # as the layer's split of the fused qkv
    assert not view.is_contiguous()
    assert torch.equal(native.decode_attention(view, k_cache, v_cache, slots, lens, None),
                       native.decode_attention(q, k_cache, v_cache, slots, lens, None))


def test_bad_inputs_are_errors_that_say_what_is_wrong(native: TorchKernels) -> None:
    q, k_cache, v_cache, slots, lens = _decode_case(2, 4, 2, 16, [3, 5], seed=8)
    cases = [
        (lambda: native.rms_norm(torch.ones(2, 4, dtype=torch.float64),
                                 torch.ones(4, dtype=torch.float64), 1e-5), "float32"),
        (lambda: native.rms_norm(torch.ones(2, 4), torch.ones(5), 1e-5), "elements"),
        (lambda: native.silu_and_mul(torch.ones(2, 5)), "even"),
        (lambda: native.write_kv(k_cache, v_cache, torch.tensor([0, 10_000]),
                                 torch.ones(2, 2, 16), torch.ones(2, 2, 16)),
         "outside the cache"),
        (lambda: native.decode_attention(q, k_cache, v_cache, slots.clamp(max=-1), lens, None),
         "outside the cache"),
        (lambda: native.decode_attention(q, k_cache, v_cache, slots, lens + 10, None),
         "context length"),
        (lambda: native.decode_attention(q, k_cache, v_cache, slots,
                                         torch.tensor([0, 1]), None), "context length"),
        (lambda: native.decode_attention(q[:, :3], k_cache, v_cache, slots, lens, None),
         "multiple of kv_heads"),
        (lambda: native.decode_attention(q, k_cache, v_cache, slots.int(), lens, None),
         "int64"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


def _small_batch(native: TorchKernels) -> nk.NativeKernels:
    assert isinstance(native, nk.NativeKernels)
    if not native.small_batch_gemm:
        pytest.skip(f"the small-batch GEMM is in the avx512 and avx2 builds, not {native.isa}")
    return native


@pytest.mark.parametrize(("rows", "k", "n", "bias", "residual"), [
    (24, 576, 960, False, True),     # SmolLM2's qkv at the bench's batch
    (1, 1536, 576, False, False),    # one decode row
    (40, 64, 577, True, True),       # two register blocks, a part panel
    (23, 3, 5, True, False),         # fewer columns than a panel, a tiny K
    (25, 17, 16, False, True),       # one full panel, a one-row second block
])
def test_the_small_batch_gemm_is_f_linear_to_float32_rounding(
        native: TorchKernels, rows: int, k: int, n: int, bias: bool, residual: bool) -> None:
    _small_batch(native)
    gen = _gen(rows * 1000 + n)
    weight = torch.randn(n, k, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    # A residual as the layer passes it: rows of a wider tensor (a stride of its own).
    res = torch.randn(rows, n + 3, generator=gen)[:, :n] if residual else None
    proj = Projection(weight, b)
    proj.use_small_batch_kernel()
    got = proj(x, res)
    exact = torch.nn.functional.linear(x.double(), weight.double(),
                                       None if b is None else b.double())
    # The worst-case error of k float32 FMAs in a row and two adds: (k + 2) units of
    # float32 rounding times the sum of the magnitudes that went in.
    scale = torch.nn.functional.linear(x.double().abs(), weight.double().abs(),
                                       None if b is None else b.double().abs())
    if res is not None:
        exact, scale = exact + res.double(), scale + res.double().abs()
    bound = (k + 2) * 2.0 ** -24 * scale
    assert got.shape == (rows, n) and got.dtype == torch.float32
    assert bool(((got.double() - exact).abs() <= bound).all())
    # And oneDNN's projection, within the two kernels' bounds of it.
    onednn = Projection(weight, b)(x, res)
    assert bool(((got.double() - onednn.double()).abs() <= 2 * bound).all())


@pytest.mark.parametrize(("rows", "k", "inter"), [
    (24, 576, 1536),   # SmolLM2's MLP at the bench's batch
    (40, 33, 48),      # two row blocks; torch's silu ends its vector loop at 32 of 48
    (3, 8, 20),        # a part panel in each half
    (1, 16, 8),        # half a panel, all of it torch's scalar tail
])
def test_the_fused_swiglu_gemm_is_the_gemm_then_silu_and_mul_bit_for_bit(
        native: TorchKernels, rows: int, k: int, inter: int) -> None:
    _small_batch(native)
    gen = _gen(rows + k + inter)
    weight = torch.randn(2 * inter, k, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    plain = torch.ops.slopilot.pack_small_batch_weight(weight, False)
    halves = torch.ops.slopilot.pack_small_batch_weight(weight, True)
    width = plain.shape[-1]   # one vector: 16 floats on AVX-512, 8 on AVX2
    assert plain.shape == (-(-2 * inter // width), k, width)
    assert halves.shape == (-(-inter // width), 2, k, width)
    gate_up = torch.ops.slopilot.small_batch_linear(x, plain, 2 * inter, None, None)
    # The interleaved packing computes the same columns, in the same place, to the bit.
    assert torch.equal(
        torch.ops.slopilot.small_batch_linear(x, halves, 2 * inter, None, None), gate_up)
    fused = torch.ops.slopilot.small_batch_swiglu(x, halves, inter)
    assert torch.equal(fused, native.silu_and_mul(gate_up))
    # And so torch's SwiGLU of that GEMM's output, which the native silu equals.
    assert torch.equal(fused, REF.silu_and_mul(gate_up))
    proj = Projection(weight, None, swiglu=True)
    proj.use_small_batch_kernel()
    assert torch.equal(native.swiglu(proj, x), fused)
    assert torch.equal(REF.swiglu(proj, x), fused)   # the long way, same kernels


def test_a_swiglu_projection_past_the_small_rows_goes_the_long_way(
        native: TorchKernels) -> None:
    _small_batch(native)
    weight = torch.randn(64, 16, generator=_gen(11))
    proj = Projection(weight, None, swiglu=True)
    proj.use_small_batch_kernel()
    large = torch.randn(SMALL_BATCH_ROWS + 1, 16, generator=_gen(12))
    assert proj.small_batch_swiglu(large) is None
    assert torch.equal(native.swiglu(proj, large),
                       native.silu_and_mul(Projection(weight, None)(large)))
    assert Projection(weight, None).small_batch_swiglu(large[:4]) is None  # not SwiGLU's


def test_projections_take_the_small_batch_gemm_only_up_to_its_rows(
        native: TorchKernels) -> None:
    _small_batch(native)
    weight = torch.randn(48, 32, generator=_gen(3))
    proj = Projection(weight, None)
    assert not proj.small_batch
    proj.use_small_batch_kernel()
    assert proj.small_batch
    small = torch.randn(SMALL_BATCH_ROWS, 32, generator=_gen(4))
    large = torch.randn(SMALL_BATCH_ROWS + 1, 32, generator=_gen(5))
    packed = torch.ops.slopilot.pack_small_batch_weight(weight)
    assert torch.equal(proj(small),
                       torch.ops.slopilot.small_batch_linear(small, packed, 48, None, None))
    # Past SMALL_BATCH_ROWS the projection is oneDNN's, as before the kernel was added.
    assert torch.equal(proj(large), Projection(weight, None)(large))
    with pytest.raises(ValueError, match="CPU float32 only"):
        Projection(weight.double(), None).use_small_batch_kernel()


def test_the_small_batch_gemm_refuses_what_it_cannot_compute(native: TorchKernels) -> None:
    small = _small_batch(native)
    assert small.small_batch_gemm
    weight = torch.randn(20, 8, generator=_gen(6))
    packed = torch.ops.slopilot.pack_small_batch_weight(weight)
    width = packed.shape[-1]
    panels, pairs = -(-20 // width), -(-10 // width)
    op = torch.ops.slopilot.small_batch_linear
    x = torch.randn(4, 8, generator=_gen(7))
    cases = [
        (lambda: op(x.double(), packed, 20, None, None), "float32"),
        (lambda: op(torch.randn(4, 9), packed, 20, None, None),
         f"not a \\[panels, 9, {width}\\]"),
        (lambda: op(x, packed, 40, None, None), f"n=40 does not fit {panels} panels"),
        (lambda: op(x, packed, 20, torch.ones(19), None), "bias has 19 elements"),
        (lambda: op(x, packed, 20, None, torch.ones(4, 19)), "residual is"),
        (lambda: op(x.t(), packed, 20, None, None), "contiguous"),
        (lambda: torch.ops.slopilot.pack_small_batch_weight(torch.ones(0, 8)), "non-empty"),
        (lambda: torch.ops.slopilot.pack_small_batch_weight(torch.ones(5, 8), True), "even"),
        (lambda: torch.ops.slopilot.small_batch_swiglu(x, packed, 10), "two halves"),
        (lambda: torch.ops.slopilot.small_batch_swiglu(
            x, torch.ops.slopilot.pack_small_batch_weight(weight, True), 30),
         f"does not fit {2 * pairs} interleaved panels"),
    ]
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


def test_the_generic_build_keeps_the_gemms_on_onednn(native: TorchKernels) -> None:
    assert nk.NativeKernels("avx512").small_batch_gemm
    assert nk.NativeKernels("avx2").small_batch_gemm
    assert not nk.NativeKernels("generic").small_batch_gemm
    proj = Projection(torch.randn(16, 8, generator=_gen(9)), None)
    nk.NativeKernels("generic").prepare([proj])
    assert not proj.small_batch
    assert isinstance(native, nk.NativeKernels)
    if native.isa == "generic":
        # This machine's library is that build: its ops say so instead of computing.
        with pytest.raises(RuntimeError, match="AVX-512 and AVX2 only"):
            torch.ops.slopilot.small_batch_linear(
                torch.ones(2, 8), torch.ones(1, 8, 8), 8, None, None)
        with pytest.raises(RuntimeError, match="AVX-512 and AVX2 only"):
            torch.ops.slopilot.small_batch_swiglu(
                torch.ones(2, 8), torch.ones(1, 2, 8, 8), 8)


def test_a_native_executor_packs_every_projection(loaded: LoadedModel,
                                                    native: TorchKernels) -> None:
    _small_batch(native)
    ex = TorchExecutor(loaded, num_gpu_blocks=16, num_cpu_blocks=0, cpu_kernels="native")
    assert "small-batch GEMM" in ex.kernels.reason
    assert all(p.small_batch for p in ex.model.projections())
    torch_ex = TorchExecutor(loaded, num_gpu_blocks=16, num_cpu_blocks=0, cpu_kernels="torch")
    assert "small-batch" not in torch_ex.kernels.reason
    # The same loaded model, fused again for torch's ops: nothing of the native packing left.
    assert not any(p.small_batch for p in torch_ex.model.projections())


@pytest.fixture(scope="module")
def loaded(tiny: Path) -> LoadedModel:
    return load_checkpoint(tiny)


def test_the_tiny_model_decodes_the_same_greedy_tokens_with_either_kernels(
        loaded: LoadedModel, native: TorchKernels) -> None:
    prompts = [list(range(10, 40)), list(range(40, 47)), [3, 4], list(range(100, 117))]
    params = [greedy(12)] * len(prompts)
    plan = Plan(chunk=6, stagger=1, swap_out_at={4: "r1"})
    runs = {}
    for mode in ("torch", "native"):
        ex = TorchExecutor(loaded, num_gpu_blocks=64, num_cpu_blocks=16, block_size=4,
                           cpu_kernels=mode)
        assert ex.kernels.native is (mode == "native")
        runs[mode] = generate(ex, prompts, params, plan)
    assert runs["native"] == runs["torch"]


def test_kernel_modes_choose_as_documented(native: TorchKernels) -> None:
    assert not nk.choose_kernels("torch", CPU, torch.float32).native
    assert nk.choose_kernels("auto", CPU, torch.float32).native
    bf16 = nk.choose_kernels("auto", CPU, torch.bfloat16)
    assert not bf16.native and "float32 only" in bf16.reason
    with pytest.raises(nk.KernelError, match="float32 only"):
        nk.choose_kernels("native", CPU, torch.bfloat16)
    with pytest.raises(nk.KernelError, match="use one of auto, native, torch"):
        nk.choose_kernels("fast", CPU, torch.float32)


def test_an_executor_with_an_unknown_kernel_mode_is_refused(loaded: LoadedModel) -> None:
    with pytest.raises(ExecutorError, match="cpu_kernels='fast'"):
        TorchExecutor(loaded, num_gpu_blocks=8, num_cpu_blocks=0, cpu_kernels="fast")


def test_the_build_follows_the_isa_torch_dispatches_to() -> None:
    # The elementwise kernels round as torch's only when both run the same Vectorized
    # body: on an AVX-512 CPU an AVX2 build's silu differs from torch's in the last bit.
    assert nk.cpu_isa("AVX512", "x86_64") == "avx512"
    assert nk.cpu_isa("AVX2", "x86_64") == "avx2"
    assert nk.cpu_isa("DEFAULT", "x86_64") == "generic"
    assert nk.cpu_isa("AVX512", "aarch64") == "generic"
    assert nk.cpu_isa("SVE256", "aarch64") == "generic"
    assert nk.cpu_isa() == nk.cpu_isa(torch.backends.cpu.get_cpu_capability())


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="the CPU has no AVX2")
def test_a_torch_held_to_avx2_gets_the_avx2_build() -> None:
    # ATEN_CPU_CAPABILITY caps torch's dispatch; the kernels must follow it down.
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run(
        [sys.executable, "-c", "from slopilot.engine.executors import native_kernels as nk;"
         " print(nk.cpu_isa())"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "avx2"


def test_the_image_compiles_every_build_a_pod_may_load() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert sorted(re.findall(r"--isa (\w+)", dockerfile)) == sorted(nk.ISAS)


def test_a_build_names_its_source_torch_and_flags(tmp_path: Path) -> None:
    a, b = nk.kernel_build("avx2", tmp_path), nk.kernel_build("generic", tmp_path)
    c = nk.kernel_build("avx512", tmp_path)
    assert len({a.name, b.name, c.name}) == 3 and a.directory.parent == tmp_path
    assert a.library == a.directory / f"{a.name}.so"
    assert nk.kernel_build("avx2", tmp_path) == a
    with pytest.raises(nk.KernelError, match="isa='sse9'"):
        nk.kernel_build("sse9", tmp_path)


def test_a_failed_build_says_what_it_needs_and_auto_falls_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's builder takes the compiler from $CXX: one that always fails.
    monkeypatch.setenv("CXX", "false")
    build = nk.kernel_build("generic", tmp_path)
    with pytest.raises(nk.KernelError, match="C\\+\\+ compiler and ninja") as err:
        nk.build_in_child(build)
    assert "--cpu-kernels torch" in str(err.value)
    assert not build.library.exists()
    assert not list(build.directory.glob("build-*"))     # no half-built leftovers


def test_a_second_build_cannot_join_the_loaded_one(native: TorchKernels,
                                                   tmp_path: Path) -> None:
    with pytest.raises(nk.KernelError, match="one process runs one build"):
        nk.load_library(nk.kernel_build("generic", tmp_path))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the avx2 build needs an x86 compiler")
def test_the_build_command_compiles_into_the_directory_given(native: TorchKernels,
                                                             tmp_path: Path) -> None:
    """What the image runs: several builds in one command, each in a child of its own
    (a build loads its library, and two in one process would both register
    torch.ops.slopilot). One is compiled here from nothing (generic, or avx2 where this
    CPU's build is generic: both compile on any x86 CPU); the other is this session's
    own build, put there first, which the command keeps as it is: its name is its
    source, torch and flags. (A second compile would cost a minute of CPU and show
    nothing the first does not; the dispatch to children is checked on its own below.)"""
    session = nk.kernel_build(nk.cpu_isa())  # built (or found) for ``native``
    fresh = "avx2" if session.isa == "generic" else "generic"
    kept = nk.kernel_build(session.isa, tmp_path)
    kept.directory.mkdir(parents=True)
    shutil.copy2(session.library, kept.library)
    before = kept.library.stat()
    done = subprocess.run(
        [sys.executable, "-m", "slopilot.engine.executors.native_kernels", "build",
         "--isa", fresh, "--isa", session.isa, "--dir", str(tmp_path)],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-2000:]
    built = nk.kernel_build(fresh, tmp_path)
    assert done.stdout.split() == [str(built.library), str(kept.library)]
    assert built.library.is_file()
    after = kept.library.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # A fresh process loads it and runs an op without building anything.
    probe = ("import torch; from slopilot.engine.executors import native_kernels as nk; "
             f"from pathlib import Path; nk.load_library(nk.kernel_build({fresh!r}, "
             f"Path({str(tmp_path)!r}))); "
             "print(torch.ops.slopilot.silu_and_mul(torch.zeros(1, 4)).shape)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and "torch.Size([1, 2])" in out.stdout, out.stderr[-2000:]


def test_several_builds_in_one_command_are_each_built_in_a_child(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command's own process compiles none of several builds (each would load its
    library there), and prints their libraries in the order asked."""
    children: list[str] = []

    def child(build: nk.KernelBuild, timeout_s: float = nk.BUILD_TIMEOUT_S) -> Path:
        children.append(build.isa)
        return build.library

    def here(build: nk.KernelBuild) -> Path:
        raise AssertionError(f"{build.isa} compiled in the command's own process")

    monkeypatch.setattr(nk, "build_in_child", child)
    monkeypatch.setattr(nk, "compile_library", here)
    isas = ["avx2", "generic", "avx512"]
    assert nk.main(["build", *(a for isa in isas for a in ("--isa", isa)),
                    "--dir", str(tmp_path)]) == 0
    assert sorted(children) == sorted(isas)
    assert capsys.readouterr().out.split() == [
        str(nk.kernel_build(isa, tmp_path).library) for isa in isas]


@pytest.mark.parametrize("mode", ["native", "torch"])
def test_the_served_engine_names_its_kernels_in_its_info(tiny: Path, mode: str,
                                                         native: TorchKernels) -> None:
    from slopilot.engine.config import EngineConfig
    from slopilot.engine.server.backends import build_torch

    backend = build_torch(EngineConfig(), str(tiny), num_gpu_blocks=32, num_cpu_blocks=0,
                          cpu_kernels=mode)
    try:
        assert backend.info["kernels"] == mode
    finally:
        backend.close()


@pytest.mark.parametrize(("dtype", "kernels"), [(None, "native"), ("bfloat16", "torch")])
def test_the_served_engine_names_its_dtype_and_a_bfloat16_one_runs_torch_ops(
        tiny: Path, dtype: str | None, kernels: str, native: TorchKernels) -> None:
    from slopilot.engine.config import EngineConfig
    from slopilot.engine.server.backends import build_torch

    backend = build_torch(EngineConfig(), str(tiny), num_gpu_blocks=32, num_cpu_blocks=0,
                          dtype=dtype)
    try:
        assert backend.info["dtype"] == (dtype or "float32")
        assert backend.info["kernels"] == kernels  # the fused kernels are float32 only
    finally:
        backend.close()


def test_the_dtype_names_are_the_executors() -> None:
    from slopilot.engine.executors import torch_runner
    from slopilot.engine.executors.kernel_modes import DTYPE_CHOICES

    assert set(DTYPE_CHOICES) == {"auto", *torch_runner._DTYPES}


def test_a_corrupt_library_falls_back_under_auto_and_fails_under_native(
        tmp_path: Path) -> None:
    """A truncated or foreign file where the build should be: auto serves with torch's
    ops and says why; native refuses. (In a fresh process: this one holds the real build.)"""
    probe = """
import torch
from slopilot.engine.executors import native_kernels as nk
build = nk.kernel_build(nk.cpu_isa())  # under $SLOPILOT_KERNEL_DIR, the temp dir
build.directory.mkdir(parents=True)
build.library.write_bytes(b"not an ELF file")
auto = nk.choose_kernels("auto", torch.device("cpu"), torch.float32)
print("AUTO", auto.native, auto.reason)
try:
    nk.choose_kernels("native", torch.device("cpu"), torch.float32)
except nk.KernelError as exc:
    print("NATIVE", exc)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=False, env={**os.environ, nk.KERNEL_DIR_ENV: str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    auto = next(line for line in done.stdout.splitlines() if line.startswith("AUTO"))
    assert auto.startswith("AUTO False torch ops: cannot load") and "delete it" in auto
    assert "NATIVE cannot load" in done.stdout
