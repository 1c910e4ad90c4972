"""Decode iterations as graph replays: the same tokens as the eager pass, padding that
never touches a request's blocks, one capture per shape, and the eager pass for the rest.

On CPU the graphs' padded static-shape pass runs without capture (``decode_graphs=
"padded"``): everything but the capture itself. The tests marked ``cuda`` capture for
real; they run where a CUDA device is (benchmarks/gpu_session.sh runs them first).
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable

import pytest
import torch

from slopilot.engine.executors.batch import BatchError
from slopilot.engine.executors.decode_graphs import DecodeGraphError, DecodeGraphs, eager_capture
from slopilot.engine.executors.graph_shapes import (
    GRAPH_MAX_BATCH,
    GraphShapeError,
    batch_buckets,
    padded_rows,
    padded_width,
    width_buckets,
)
from slopilot.engine.executors.kv_cache import CacheError, PagedKVCache
from slopilot.engine.executors.loader import LoadedModel
from slopilot.engine.executors.torch_runner import ExecutorError, TorchExecutor
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams
from tests.engine.graph_support import (
    PROMPTS,
    Make,
    cuda,
    decode_rows,
    forgetful,
    prefilled,
    row,
    touched_slots,
)
from tests.engine.torch_driver import Plan, generate, greedy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_buckets_cover_every_size_with_at_most_half_again() -> None:
    batches = batch_buckets(256)
    assert batches[:10] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert batches[-1] == 256
    assert all(b < a <= b * 3 // 2 + 1 for b, a in itertools.pairwise(batches))
    assert batch_buckets(1) == [1] and batch_buckets(5) == [1, 2, 3, 4, 5]
    widths = width_buckets(1000, 16)
    assert widths[0] == 32 and widths[-1] == 1008
    assert all(w % 16 == 0 for w in widths) and widths == sorted(set(widths))
    assert width_buckets(20, 16) == [32]
    assert width_buckets(100, 64) == [64, 128]
    with pytest.raises(GraphShapeError, match="max_graph_batch=0"):
        batch_buckets(0)


def test_the_twins_padding_is_the_executors() -> None:
    # sim/shape.py pads a replayed pass with padded_rows and padded_width: the shapes
    # the executor captures (block size 16, any context up to the model's).
    batches = batch_buckets(GRAPH_MAX_BATCH)
    assert [padded_rows(n) for n in range(1, 257)] == \
        [next(b for b in batches if b >= n) for n in range(1, 257)]
    widths = width_buckets(8192, 16)
    assert [padded_width(c) for c in range(1, 8193)] == \
        [next(w for w in widths if w >= c) for c in range(1, 8193)]


@pytest.mark.parametrize("plan", [Plan(chunk=64), Plan(chunk=3, stagger=1),
                                  Plan(chunk=5, stagger=1, swap_out_at={4: "r0", 7: "r1"})],
                         ids=["decode-only", "mixed", "swapped"])
def test_padded_graphs_give_the_eager_tokens(make: Make, plan: Plan) -> None:
    prompts = [list(range(10, 30)), list(range(40, 47)), [3, 4], list(range(60, 73))]
    seeded = SamplingParams(max_tokens=9, ignore_eos=True, temperature=1.3, seed=7)
    params = [greedy(9), seeded, greedy(9), greedy(9)]
    eager = generate(make("off"), prompts, params, plan)
    ex = make("padded")
    assert generate(ex, prompts, params, plan) == eager
    assert ex.decode_graphs is not None and ex.decode_graphs.captured


def test_padded_logprobs_equal_the_eager_ones(make: Make) -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=3)
    results = []
    for mode in ("off", "padded"):
        ex = make(mode)
        first = prefilled(ex)
        results.append(ex.execute(SchedulerOutput(seqs=decode_rows(first, params))))
    eager, padded = results
    assert padded.sampled == eager.sampled
    for rid in PROMPTS:
        e, p = eager.logprobs[rid], padded.logprobs[rid]
        assert (p.token_id, p.rank) == (e.token_id, e.rank)
        assert [t for t, _ in p.top] == [t for t, _ in e.top] and len(p.top) == 3
        assert p.logprob == pytest.approx(e.logprob, abs=1e-5)
        assert [x for _, x in p.top] == pytest.approx([x for _, x in e.top], abs=1e-5)


def test_padding_writes_only_the_scratch_block(make: Make) -> None:
    ex = make("padded")
    first = prefilled(ex)
    before = ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks].clone()
    rows = decode_rows(first)
    out = ex.execute(SchedulerOutput(seqs=rows))
    assert ex.decode_graphs is not None and ex.decode_graphs.captured == [(6, 32)]
    assert set(out.sampled) == set(PROMPTS)
    # The five new tokens' slots, and nothing else a request owns, changed.
    assert touched_slots(before, ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks]) == {
        (r.block_table[r.start_pos // 4], r.start_pos % 4) for r in rows}
    assert torch.isfinite(ex.kv_cache.gpu[:, :, ex.num_gpu_blocks:]).all()


def test_only_sampling_rows_answer(make: Make) -> None:
    ex = make("padded")
    first = prefilled(ex)
    rows = decode_rows(first)
    # A sixth single-token row that does not sample: a one-token prompt chunk.
    rows.append(row("f", [9], 0, [30], sample=False))
    eager = make("off")
    prefilled(eager)
    want = eager.execute(SchedulerOutput(seqs=rows)).sampled
    got = ex.execute(SchedulerOutput(seqs=rows)).sampled
    assert got == want and set(got) == set(PROMPTS)
    assert ex.decode_graphs is not None and ex.decode_graphs.captured == [(6, 32)]


def test_a_replay_where_no_row_samples(make: Make) -> None:
    """Single-token rows that all stop short of their request's end (prompt chunks of one
    token, as a budget with one token left or a chunk_size of 1 cut them) still replay:
    the empty list of sampling rows once indexed the logits as a float tensor and failed."""
    ex = make("padded")
    prefilled(ex)
    rows = [row("f", [9], 0, [30], sample=False), row("g", [8], 0, [31], sample=False)]
    assert ex.decode_graphs is not None and ex.decode_graphs.takes(SchedulerOutput(seqs=rows))
    assert ex.execute(SchedulerOutput(seqs=rows)).sampled == {}
    # The replay wrote both tokens' keys and values, as the eager pass does.
    assert torch.isfinite(ex.kv_cache.gpu[:, :, [30, 31], 0]).all()


def _counting(captures: list[int]) -> Callable[..., object]:
    def capture(run: Callable[[], torch.Tensor]) -> object:
        captures.append(1)
        return eager_capture(run)
    return capture


def test_each_shape_is_captured_once(make: Make) -> None:
    ex = make("padded")
    captures: list[int] = []
    graphs = DecodeGraphs(ex.model, ex.kv_cache, max_model_len=ex.max_model_len,
                          capture=_counting(captures))  # type: ignore[arg-type]
    ex.decode_graphs = graphs
    first = prefilled(ex)
    rows = decode_rows(first)
    spare = iter(range(20, 40))
    for batch in (rows[:1], rows[:2], rows[:1], rows[:2], rows[:3]):
        ex.execute(SchedulerOutput(seqs=batch))
        for r in batch:  # the same rows decode on
            r.start_pos += 1
            r.token_ids = [1]
            if r.start_pos == 4 * len(r.block_table):
                r.block_table.append(next(spare))
    assert graphs.captured == [(1, 32), (2, 32), (3, 32)] and len(captures) == 3


def test_what_a_graph_does_not_take_runs_eagerly(make: Make) -> None:
    ex = make("padded", max_graph_batch=4)
    graphs = ex.decode_graphs
    assert graphs is not None
    first = prefilled(ex)
    rows = decode_rows(first)
    mixed = [rows[0], row("p", [1, 2, 3], 0, [30])]
    logprob_prompt = SchedulerOutput(seqs=rows[:1], prompt_logprob_targets={"a": [4]})
    for out in (SchedulerOutput(seqs=rows), SchedulerOutput(seqs=mixed), logprob_prompt,
                SchedulerOutput()):
        assert not graphs.takes(out)
    assert graphs.takes(SchedulerOutput(seqs=rows[:4]))
    assert set(ex.execute(SchedulerOutput(seqs=rows)).sampled) == set(PROMPTS)
    assert graphs.captured == []
    with pytest.raises(DecodeGraphError, match="shape_for"):
        graphs.run(rows)


@pytest.mark.parametrize(("row", "message"), [
    (row("x", [1], 8, [0]), "need 3 blocks"),
    (row("x", [1], 2, [40]), r"block ids \[40\] are outside the cache's 40 blocks"),
    (row("x", [1], -1, [0]), "outside the model's context"),
])
def test_bad_rows_are_refused_before_any_capture(make: Make, row: ScheduledSeq,
                                                 message: str) -> None:
    # Block 40 is the scratch block: it exists in the tensor, but no request may own it.
    ex = make("padded")
    with pytest.raises(BatchError, match=message):
        ex.execute(SchedulerOutput(seqs=[row]))
    assert ex.decode_graphs is not None and ex.decode_graphs.captured == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decode_graphs": "fast"}, "decode_graphs='fast': use one of auto, cuda, padded, off"),
    ({"max_graph_batch": 0}, "max_graph_batch=0: must be >= 1"),
])
def test_bad_settings(loaded_tiny: LoadedModel, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ExecutorError, match=message):
        TorchExecutor(loaded_tiny, num_gpu_blocks=8, **kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_graphs_need_a_cuda_device(loaded_tiny: LoadedModel) -> None:
    with pytest.raises(ExecutorError, match="decode_graphs='cuda' on device 'cpu'"):
        TorchExecutor(loaded_tiny, num_gpu_blocks=8, decode_graphs="cuda")
    # auto means no graphs on CPU, and no scratch block either.
    ex = TorchExecutor(loaded_tiny, num_gpu_blocks=8)
    assert ex.decode_graphs is None and ex.kv_cache.gpu.shape[2] == 8


def test_graphs_refuse_a_cache_without_scratch(make: Make) -> None:
    ex = make("off")
    with pytest.raises(DecodeGraphError, match="scratch_blocks=1"):
        DecodeGraphs(ex.model, ex.kv_cache, max_model_len=64, capture=eager_capture)
    with pytest.raises(CacheError, match="scratch_blocks=-1"):
        PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=4, num_gpu_blocks=2,
                     num_cpu_blocks=0, block_size=4, dtype=torch.float32,
                     device=torch.device("cpu"), scratch_blocks=-1)


@cuda
@pytest.mark.parametrize("plan", [Plan(chunk=64), Plan(chunk=5, stagger=1,
                                                       swap_out_at={4: "r0", 7: "r1"})],
                         ids=["decode-only", "swapped"])
def test_cuda_graphs_give_the_eager_tokens(make: Make, plan: Plan) -> None:
    prompts = [list(range(10, 30)), list(range(40, 47)), [3, 4], list(range(60, 73))]
    seeded = SamplingParams(max_tokens=9, ignore_eos=True, temperature=1.3, seed=7)
    params = [greedy(9), seeded, greedy(9), greedy(9)]
    kw = dict(device="cuda", dtype="float32")
    eager = generate(make("off", **kw), prompts, params, plan)
    ex = make("cuda", **kw)
    assert generate(ex, prompts, params, plan) == eager
    assert ex.decode_graphs is not None and ex.decode_graphs.captured


@cuda
def test_cuda_graph_padding_writes_only_the_scratch_block(make: Make) -> None:
    ex = make("cuda", device="cuda", dtype="float32")
    first = prefilled(ex)
    before = ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks].clone()
    rows = decode_rows(first)
    ex.execute(SchedulerOutput(seqs=rows[:2]))   # a capture at batch 2
    ex.execute(SchedulerOutput(seqs=rows))       # and at 3: then replays of both
    assert touched_slots(before, ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks]) == {
        (r.block_table[r.start_pos // 4], r.start_pos % 4) for r in rows}


def test_capture_all_takes_every_reachable_shape_once(make: Make) -> None:
    ex = make("padded", max_model_len=100)
    graphs = ex.decode_graphs
    assert graphs is not None and graphs.widths == [32, 48, 64, 96, 100]
    # 5 rows reach the batch bucket of 6; 50 tokens the width of 64.
    assert graphs.capture_all(5, 50) == 5 * 3
    assert set(graphs.captured) == {(b, w) for b in (1, 2, 3, 4, 6) for w in (32, 48, 64)}
    assert graphs.captured[0] == (6, 64)  # the largest first
    assert graphs.capture_all(5, 50) == 0
    assert graphs.capture_all(2, 100) == 2 * 2  # batches 1 and 2 at widths 96 and 100
    # Ahead of serving only where the graphs are CUDA's: a padded pass captured ahead
    # would just run once.
    assert ex.capture_decode_graphs(8, 100) == 0
    first = prefilled(ex)
    before = len(graphs.captured)
    assert set(ex.execute(SchedulerOutput(seqs=decode_rows(first))).sampled) == set(PROMPTS)
    assert len(graphs.captured) == before
    assert make("off").capture_decode_graphs(8) == 0


def test_a_graph_keeps_alive_what_its_capture_read(make: Make) -> None:
    """A CUDA graph holds the addresses of the tensors its capture read, not the tensors:
    a capture that keeps nothing (as ``torch.cuda.graph`` keeps nothing) must still
    replay, because the graph's owner keeps the computation and what it closes over."""
    ex = make("padded")
    ex.decode_graphs = DecodeGraphs(ex.model, ex.kv_cache, max_model_len=ex.max_model_len,
                                    capture=forgetful)
    first = prefilled(ex)
    eager = make("off")
    prefilled(eager)
    rows = decode_rows(first)
    ex.execute(SchedulerOutput(seqs=rows[:1]))  # captured here
    gc.collect()
    assert ex.execute(SchedulerOutput(seqs=rows)).sampled == \
        eager.execute(SchedulerOutput(seqs=rows)).sampled
