"""TorchExecutor on the tiny random model: swap, sampling rows, sizing and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.engine import LLMEngine, VirtualClock
from slopilot.engine.executors.batch import BatchError
from slopilot.engine.executors.kv_cache import CacheError, PagedKVCache
from slopilot.engine.executors.loader import LoadedModel, load_checkpoint
from slopilot.engine.executors.torch_runner import ExecutorError, TorchExecutor
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams
from tests.engine.helpers import make_request
from tests.engine.test_metrics import value
from tests.engine.torch_driver import Plan, generate, greedy

# Both fixtures live in tests/engine/conftest.py.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def loaded(tiny: Path) -> LoadedModel:
    return load_checkpoint(tiny)


def _executor(loaded: LoadedModel) -> TorchExecutor:
    return TorchExecutor(loaded, num_gpu_blocks=32, num_cpu_blocks=8, block_size=4)


def _row(rid: str, tokens: list[int], start: int, table: list[int], sample: bool = True,
         params: SamplingParams | None = None, n_out: int = 0) -> ScheduledSeq:
    return ScheduledSeq(rid, tokens, start, table, sample, params or greedy(4), n_out)


def test_swap_copies_real_blocks(loaded: LoadedModel) -> None:
    ex = _executor(loaded)
    # The cache is allocated uninitialised (the pages fault in on first write), so the
    # two slots of block 2 past the prompt hold whatever the allocator gave: poison
    # them with NaN so the check below is the same on every run, and a swap must copy
    # whole blocks, garbage included, bit for bit.
    ex.kv_cache.gpu.fill_(float("nan"))
    ex.execute(SchedulerOutput(seqs=[_row("a", list(range(3, 13)), 0, [5, 9, 2])]))
    written = ex.kv_cache.gpu[:, :, [5, 9, 2]].clone()
    # Ten tokens in blocks of four: blocks 5 and 9 full, block 2 holds slots 0-1.
    tokens = torch.cat([written[:, :, :2].flatten(2, 3), written[:, :, 2, :2]], dim=2)
    assert torch.isfinite(tokens).all() and tokens.abs().sum() > 0
    assert written[:, :, 2, 2:].isnan().all()
    ex.execute(SchedulerOutput(swap_out=[(5, 0), (9, 7), (2, 3)]))
    torch.testing.assert_close(ex.kv_cache.cpu[:, :, [0, 7, 3]], written, equal_nan=True)
    ex.execute(SchedulerOutput(swap_in=[(0, 20), (7, 21), (3, 22)]))
    torch.testing.assert_close(ex.kv_cache.gpu[:, :, [20, 21, 22]], written, equal_nan=True)
    assert ex.kv_cache.k_cache(1).shape == (32, 4, 2, 16)


def test_swap_out_happens_before_swap_in_of_the_same_block(loaded: LoadedModel) -> None:
    ex = _executor(loaded)
    ex.kv_cache.gpu[:, :, 1] = 1.0
    ex.kv_cache.cpu[:, :, 2] = 2.0
    # Block 1 goes out to host 0 while host 2 comes into the freed block 1.
    ex.execute(SchedulerOutput(swap_out=[(1, 0)], swap_in=[(2, 1)]))
    assert ex.kv_cache.cpu[:, :, 0].eq(1.0).all()
    assert ex.kv_cache.gpu[:, :, 1].eq(2.0).all()


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_swap_copies_are_timed_on_the_executors_clock(loaded: LoadedModel) -> None:
    clock = FakeClock()
    ex = TorchExecutor(loaded, num_gpu_blocks=32, num_cpu_blocks=8, block_size=4,
                       clock=clock)
    cache = ex.kv_cache
    copy_out, copy_in = cache.swap_out, cache.swap_in

    def slow_out(pairs: list[tuple[int, int]]) -> None:
        clock.t += 0.25 * len(pairs)
        copy_out(pairs)

    def slow_in(pairs: list[tuple[int, int]]) -> None:
        clock.t += 0.125 * len(pairs)
        copy_in(pairs)

    cache.swap_out, cache.swap_in = slow_out, slow_in  # type: ignore[method-assign]
    cache.gpu[:, :, 1] = 1.0
    cache.cpu[:, :, 2] = 2.0
    result = ex.execute(SchedulerOutput(swap_out=[(1, 0), (3, 5)], swap_in=[(2, 1)]))
    assert (result.swap_out_s, result.swap_in_s) == (0.5, 0.125)
    assert result.elapsed_s == 0.625
    assert cache.cpu[:, :, 0].eq(1.0).all() and cache.gpu[:, :, 1].eq(2.0).all()
    # An iteration without swaps times none: nothing for the scheduler to learn from.
    result = ex.execute(SchedulerOutput(seqs=[_row("a", [3, 4, 5], 0, [7])]))
    assert (result.swap_out_s, result.swap_in_s) == (None, None)


def test_slow_swap_copies_are_exported_and_turn_victims_to_recompute(
        loaded: LoadedModel) -> None:
    clock = FakeClock()
    ex = TorchExecutor(loaded, num_gpu_blocks=8, num_cpu_blocks=32, block_size=16,
                       clock=clock)
    copy_out = ex.kv_cache.swap_out
    copied: list[int] = []

    def slow_out(pairs: list[tuple[int, int]]) -> None:
        clock.t += 0.05 * len(pairs)  # 50 ms a block; the guess is microseconds
        copied.append(len(pairs))
        copy_out(pairs)

    ex.kv_cache.swap_out = slow_out  # type: ignore[method-assign]
    cfg = EngineConfig().with_overrides({"budget_align": 1, "kv_watermark": 0.0,
                                         "preemption_mode": "swap", "swap_timeout_ms": 50})
    metrics = EngineMetrics("tiny", clock=lambda: 0.0)
    engine = LLMEngine(cfg, ex, ex.num_gpu_blocks, ex.num_cpu_blocks,
                       ex.swap_time_per_block_s, clock=VirtualClock(),
                       observers=[MetricsObserver(metrics)])
    for i in range(3):
        engine.add_request(make_request(f"r{i}", 20, max_tokens=60, first_token=10 + 30 * i))
    engine.run_until_idle()
    sched = engine.scheduler
    sched.check_integrity()
    # The guess let the first victim swap, and one slow copy may be a spike; the next
    # slow ones were believed, and within a few swaps the others were turned away.
    swaps = sched.num_preemptions[PreemptionMode.SWAP]
    assert 2 <= swaps <= 4, swaps
    assert sched.num_preemptions[PreemptionMode.RECOMPUTE] >= 1
    assert sched.swap_s_per_block > 0.025  # toward the copies' 50 ms, from microseconds
    # The swap-outs' 50 ms a block; their swap-ins, on this clock, took none.
    assert 2 <= len(copied) <= swaps
    assert value(metrics, "slopilot_swap_seconds_total") == pytest.approx(0.05 * sum(copied))


def test_only_sampling_rows_answer(loaded: LoadedModel) -> None:
    ex = _executor(loaded)
    out = ex.execute(SchedulerOutput(seqs=[
        _row("partial", [5, 6, 7], 0, [0], sample=False),
        _row("whole", [8, 9], 0, [1]),
    ]))
    assert set(out.sampled) == {"whole"}
    assert out.elapsed_s > 0
    assert ex.execute(SchedulerOutput()).sampled == {}


def test_chunking_and_batching_do_not_change_greedy_tokens(loaded: LoadedModel) -> None:
    prompts = [list(range(10, 30)), list(range(40, 47)), [3, 4]]
    params = [greedy(6)] * 3
    alone = [generate(_executor(loaded), [p], [params[0]], Plan(chunk=64))["r0"]
             for p in prompts]
    together = generate(_executor(loaded), prompts, params,
                        Plan(chunk=5, stagger=1, swap_out_at={3: "r0", 6: "r1"}))
    assert [together[f"r{i}"] for i in range(3)] == alone


def test_seeded_request_is_reproducible_across_batches(loaded: LoadedModel) -> None:
    seeded = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.5, seed=42)
    prompt = list(range(10, 30))
    alone = generate(_executor(loaded), [prompt], [seeded], Plan(chunk=64))["r0"]
    noisy = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.5)
    crowd = generate(_executor(loaded), [list(range(50, 61)), prompt, [7, 8, 9]],
                     [noisy, seeded, noisy], Plan(chunk=3, stagger=1))
    assert crowd["r1"] == alone
    other_seed = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.5, seed=43)
    assert generate(_executor(loaded), [prompt], [other_seed], Plan())["r0"] != alone


def test_sizing_from_memory_and_exposed_fields(loaded: LoadedModel) -> None:
    cfg = loaded.config
    ex = TorchExecutor(loaded, kv_cache_gb=0.001, swap_space_gb=0.0005, block_size=8)
    block = PagedKVCache.block_bytes(num_layers=cfg.num_hidden_layers,
                                     num_kv_heads=cfg.num_key_value_heads,
                                     head_dim=cfg.head_dim, block_size=8, dtype=torch.float32)
    assert ex.block_bytes == block
    assert ex.num_gpu_blocks == (1 << 30) // 1000 // block
    assert ex.num_cpu_blocks == (1 << 30) // 2000 // block
    assert ex.eos_token_id is not None and ex.eos_token_id in ex.eos_token_ids
    assert TorchExecutor(loaded, max_model_len=100, num_gpu_blocks=4).max_model_len == 100


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dtype": "float64"}, "dtype='float64': use one of"),
    ({"block_size": 0}, "block_size=0"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
    ({"swap_space_gb": -1.0}, "swap_space_gb=-1.0"),
    ({"kv_cache_gb": 0.0}, "kv_cache_gb=0.0"),
    ({"num_threads": 0}, "num_threads=0"),
])
def test_bad_settings(loaded: LoadedModel, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ExecutorError, match=message):
        TorchExecutor(loaded, **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_a_gpu(loaded: LoadedModel) -> None:
    with pytest.raises(ExecutorError, match="no CUDA device"):
        TorchExecutor(loaded, device="cuda")


def test_zero_blocks_refused() -> None:
    with pytest.raises(CacheError, match="num_gpu_blocks=0"):
        PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=8, num_gpu_blocks=0,
                     num_cpu_blocks=0, block_size=4, dtype=torch.float32,
                     device=torch.device("cpu"))


@pytest.mark.parametrize(("row", "message"), [
    (_row("short", list(range(9)), 0, [0, 1]), "need 3 blocks of 4 tokens"),
    (_row("far", [5], 0, [99]), r"block ids \[99\] are outside"),
    (_row("long", [5], 2048, [0] * 513), "outside the model's context of 2048"),
    (_row("empty", [], 0, [0]), "has no tokens"),
])
def test_bad_rows(loaded: LoadedModel, row: ScheduledSeq, message: str) -> None:
    with pytest.raises(BatchError, match=message):
        _executor(loaded).execute(SchedulerOutput(seqs=[row]))


@pytest.mark.parametrize(("out", "message"), [
    (SchedulerOutput(swap_out=[(40, 0)]), r"swap-out device block ids \[40\]"),
    (SchedulerOutput(swap_out=[(0, 8)]), r"swap-out host block ids \[8\]"),
    (SchedulerOutput(swap_in=[(0, 32)]), r"swap-in device block ids \[32\]"),
])
def test_bad_swaps(loaded: LoadedModel, out: SchedulerOutput, message: str) -> None:
    with pytest.raises(CacheError, match=message):
        _executor(loaded).execute(out)


def test_attention_never_runs_on_cudnn(loaded: LoadedModel,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's SDPA builds an execution plan per new shape, and a served batch's shape is
    new nearly every step (contexts grow by a token, chunks vary): on an H200 a served
    decode of 8 rows took 80 ms, 2 ms of host time per layer in plan building, where the
    same shape repeated took 14 ms (benchmarks/gpu_step_jitter.py). Every attention call
    of an iteration runs with the cuDNN backend off; the flag is global, so it is checked
    here on the CPU too."""
    import torch.nn.functional as F

    sdpa, seen = F.scaled_dot_product_attention, []

    def watched(*args: torch.Tensor, **kw: object) -> torch.Tensor:
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "scaled_dot_product_attention", watched)
    ex = _executor(loaded)
    ex.execute(SchedulerOutput(seqs=[_row("a", list(range(3, 13)), 0, [5, 9, 2])]))
    ex.execute(SchedulerOutput(seqs=[_row("a", [13], 10, [5, 9, 2]),
                                     _row("b", list(range(3, 9)), 0, [1, 3])]))
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the iteration


GIB = 1 << 30


def _room(monkeypatch: pytest.MonkeyPatch, nbytes: int) -> None:
    """The host memory available, as the executor's sizing reads it."""
    from slopilot.engine.executors import torch_runner
    from slopilot.engine.executors.device_room import Room

    monkeypatch.setattr(torch_runner, "device_room",
                        lambda device: Room(nbytes, "host memory available"))


def _suggested(message: str) -> str:
    return message.split("give at most ")[1].split(",")[0].split()[0]


@pytest.mark.parametrize("graphs", ["off", "padded"])  # padded: one scratch block
def test_the_kv_cache_gb_a_refusal_suggests_is_accepted(
        loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, graphs: str) -> None:
    # 0.0176 GiB of room: "give at most 0.02" rounded up past it (and the scratch block
    # was not counted), so the value the refusal gave was refused in turn.
    _room(monkeypatch, int(0.0176 * GIB))
    with pytest.raises(ExecutorError, match=r"--kv-cache-gb 1\.0: ") as refused:
        TorchExecutor(loaded, kv_cache_gb=1.0, num_cpu_blocks=0, decode_graphs=graphs)
    gb = float(_suggested(str(refused.value)))
    ex = TorchExecutor(loaded, kv_cache_gb=gb, num_cpu_blocks=0, decode_graphs=graphs)
    assert (ex.num_gpu_blocks + ex.kv_cache.scratch_blocks) * ex.block_bytes \
        <= int(0.0176 * GIB)
    # Rounded down by no more than its last digit: not a needlessly small cache.
    assert ex.num_gpu_blocks * ex.block_bytes > 0.017 * GIB


def test_a_room_under_a_hundredth_of_a_gib_suggests_what_fits_not_zero(
        loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 MiB: "give at most 0.00", which --kv-cache-gb refuses as "must be > 0".
    _room(monkeypatch, 4 << 20)
    with pytest.raises(ExecutorError) as refused:
        TorchExecutor(loaded, kv_cache_gb=1.0, num_cpu_blocks=0, decode_graphs="off")
    gb = float(_suggested(str(refused.value)))
    assert gb > 0
    ex = TorchExecutor(loaded, kv_cache_gb=gb, num_cpu_blocks=0, decode_graphs="off")
    assert ex.num_gpu_blocks * ex.block_bytes <= 4 << 20


@pytest.mark.parametrize("flag", ["kv_cache_gb", "num_gpu_blocks"])
def test_a_room_that_holds_no_block_says_so(
        loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    block = PagedKVCache.block_bytes(
        num_layers=loaded.config.num_hidden_layers,
        num_kv_heads=loaded.config.num_key_value_heads, head_dim=loaded.config.head_dim,
        block_size=16, dtype=torch.float32)
    _room(monkeypatch, block + block // 2)  # one block, but not it and the scratch one
    kwargs = {"kv_cache_gb": 1.0} if flag == "kv_cache_gb" else {"num_gpu_blocks": 4}
    with pytest.raises(ExecutorError) as refused:
        TorchExecutor(loaded, num_cpu_blocks=0, decode_graphs="padded", **kwargs)
    message = str(refused.value)
    assert "give at most" not in message
    assert "not even one" in message and "free some memory" in message, message


def test_the_host_blocks_swaps_land_in_first_are_resident_from_the_start(
        loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    # The block manager hands out the lowest fresh host blocks first: one device
    # cacheful of them is written at start, so a swap-out never faults its pages in
    # until more than a cacheful is parked in host memory at once.
    ex = TorchExecutor(loaded, num_gpu_blocks=8, num_cpu_blocks=32, block_size=16)
    assert ex.kv_cache.resident_cpu_blocks == 8
    small = TorchExecutor(loaded, num_gpu_blocks=8, num_cpu_blocks=5, block_size=16)
    assert small.kv_cache.resident_cpu_blocks == 5
    # No more than half the host memory the device cache leaves (on CPU the device
    # cache is host memory too): the rest of the pool faults in as it is first used.
    block = ex.block_bytes
    _room(monkeypatch, (8 + 1 + 6) * block)  # the cache and its scratch block, and 6
    tight = TorchExecutor(loaded, num_gpu_blocks=8, num_cpu_blocks=32, block_size=16)
    assert tight.kv_cache.resident_cpu_blocks == 3
