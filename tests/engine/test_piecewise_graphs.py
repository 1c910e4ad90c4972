"""Passes with prefill chunks as piece replays around eager attention: the eager pass's
tokens and logprobs, padding that never touches a request's blocks, one capture per
bucket, what they cannot take run eagerly, and bad settings refused by name.

On CPU the pieces run without capture (``piecewise_graphs="padded"``); the tests marked
``cuda`` capture for real (benchmarks/gpu_session.sh runs them first on a device).
"""

from __future__ import annotations

import gc

import pytest
import torch

from slopilot.engine.executors.piecewise_graphs import PiecewiseGraphError, PiecewiseGraphs
from slopilot.engine.executors.torch_runner import ExecutorError
from slopilot.engine.outputs import SchedulerOutput
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

_MIXED_PROMPTS = [list(range(10, 30)), list(range(40, 47)), [3, 4], list(range(60, 73))]


@pytest.mark.parametrize("plan", [Plan(chunk=64), Plan(chunk=3, stagger=1),
                                  Plan(chunk=5, stagger=1, swap_out_at={4: "r0", 7: "r1"})],
                         ids=["whole-prompts", "chunked", "swapped"])
@pytest.mark.parametrize("decode", ["off", "padded"])
def test_piece_replays_give_the_eager_tokens(make: Make, plan: Plan, decode: str) -> None:
    seeded = SamplingParams(max_tokens=9, ignore_eos=True, temperature=1.3, seed=7)
    params = [greedy(9), seeded, greedy(9), greedy(9)]
    eager = generate(make("off"), _MIXED_PROMPTS, params, plan)
    ex = make(decode, piecewise_graphs="padded")
    assert generate(ex, _MIXED_PROMPTS, params, plan) == eager
    assert ex.piecewise_graphs is not None and ex.piecewise_graphs.captured


def test_prompt_and_sample_logprobs_equal_the_eager_ones(make: Make) -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    prompt = list(range(3, 13))
    out = SchedulerOutput(seqs=[row("a", prompt, 0, [5, 9, 2], params)],
                          prompt_logprob_targets={"a": prompt[1:]})
    eager = make("off").execute(out)
    ex = make("off", piecewise_graphs="padded")
    pieces = ex.execute(out)
    assert ex.piecewise_graphs is not None and ex.piecewise_graphs.captured == [12]
    assert pieces.sampled == eager.sampled
    e, p = eager.logprobs["a"], pieces.logprobs["a"]
    assert (p.token_id, p.rank, [t for t, _ in p.top]) == (e.token_id, e.rank,
                                                           [t for t, _ in e.top])
    assert p.logprob == pytest.approx(e.logprob, abs=1e-5)
    got, want = pieces.prompt_logprobs["a"], eager.prompt_logprobs["a"]
    assert [x.token_id for x in got] == [x.token_id for x in want] and len(got) == 9
    assert [x.logprob for x in got] == pytest.approx([x.logprob for x in want], abs=1e-5)


def test_padding_writes_only_the_scratch_block(make: Make) -> None:
    ex = make("off", piecewise_graphs="padded")
    first = prefilled(ex)
    before = ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks].clone()
    # Four decodes and a 3-token chunk after 4 cached tokens: 7 tokens, padded to 8.
    rows = [*decode_rows(first)[:4], row("f", [7, 8, 9], 4, [30, 31])]
    ex.execute(SchedulerOutput(seqs=rows))
    # The prefill's 29 tokens ran as 32, this pass as 8.
    assert ex.piecewise_graphs is not None and ex.piecewise_graphs.captured == [32, 8]
    written = {(r.block_table[r.start_pos // 4], r.start_pos % 4) for r in rows[:4]}
    written |= {(30 + p // 4, p % 4) for p in range(4, 7)}
    assert touched_slots(before, ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks]) == written
    assert torch.isfinite(ex.kv_cache.gpu[:, :, ex.num_gpu_blocks:]).all()


def test_each_bucket_is_captured_once_with_a_piece_per_layer_and_one(make: Make) -> None:
    ex = make("off", piecewise_graphs="padded")
    captures: list[int] = []

    def counting(run):  # type: ignore[no-untyped-def]
        captures.append(1)
        return forgetful(run)

    ex.piecewise_graphs = PiecewiseGraphs(ex.model, ex.kv_cache, capture=counting)
    layers = ex.config.num_hidden_layers
    for prompt in ([1, 2, 3], [4, 5, 6, 7], [8, 9, 10], [1] * 11, [2] * 12):
        ex.execute(SchedulerOutput(seqs=[row("x", prompt, 0, [0, 1, 2])]))
        gc.collect()  # a capture that kept nothing alive still replays
    assert ex.piecewise_graphs.captured == [3, 4, 12]
    assert len(captures) == 3 * (layers + 1)


def test_what_the_pieces_cannot_take_runs_eagerly(make: Make) -> None:
    ex = make("off", piecewise_graphs="padded", max_graph_tokens=6)
    pieces = ex.piecewise_graphs
    assert pieces is not None
    assert pieces.bucket_for(6) == 6 and pieces.bucket_for(7) is None
    out = ex.execute(SchedulerOutput(seqs=[row("x", list(range(3, 13)), 0, [5, 9, 2])]))
    assert set(out.sampled) == {"x"} and pieces.captured == []
    # A decode-only pass goes to the decode graphs where they are on, not the pieces.
    both = make("padded", piecewise_graphs="padded")
    first = prefilled(both)
    both.execute(SchedulerOutput(seqs=decode_rows(first)))
    # The prefill only: its 29 tokens padded to 32.
    assert sum(len(p) for p, _ in PROMPTS.values()) == 29
    assert both.piecewise_graphs is not None and both.piecewise_graphs.captured == [32]
    assert both.decode_graphs is not None and both.decode_graphs.captured == [(6, 32)]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"piecewise_graphs": "fast"}, "piecewise_graphs='fast': use one of"),
    ({"piecewise_graphs": "cuda"}, "piecewise_graphs='cuda' on device 'cpu'"),
    ({"piecewise_graphs": "padded", "max_graph_tokens": 0}, "max_graph_tokens=0"),
])
def test_bad_settings_name_the_field(make: Make, kwargs: dict[str, object],
                                     message: str) -> None:
    if torch.cuda.is_available() and kwargs.get("piecewise_graphs") == "cuda":
        pytest.skip("checks the no-CUDA message")
    with pytest.raises(ExecutorError, match=message):
        make("off", **kwargs)


def test_the_pieces_need_a_scratch_block(make: Make) -> None:
    ex = make("off")
    with pytest.raises(PiecewiseGraphError, match="scratch_blocks=1"):
        PiecewiseGraphs(ex.model, ex.kv_cache, capture=forgetful)


@cuda
@pytest.mark.parametrize("plan", [Plan(chunk=64), Plan(chunk=5, stagger=1,
                                                       swap_out_at={4: "r0", 7: "r1"})],
                         ids=["whole-prompts", "swapped"])
def test_cuda_piece_replays_give_the_eager_tokens(make: Make, plan: Plan) -> None:
    params = [greedy(9)] * 4
    kw = dict(device="cuda", dtype="float32")
    eager = generate(make("off", **kw), _MIXED_PROMPTS, params, plan)
    ex = make("cuda", piecewise_graphs="cuda", **kw)
    assert generate(ex, _MIXED_PROMPTS, params, plan) == eager
    assert ex.piecewise_graphs is not None and ex.piecewise_graphs.captured
    assert ex.profile_kernels == "cuda-graphs-piecewise"
    with pytest.raises(ExecutorError, match="decode_graphs off"):
        make("off", piecewise_graphs="cuda", **kw)


@cuda
def test_cuda_piece_padding_writes_only_the_scratch_block(make: Make) -> None:
    ex = make("cuda", piecewise_graphs="cuda", device="cuda", dtype="float32")
    first = prefilled(ex)
    before = ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks].clone()
    rows = [*decode_rows(first)[:4], row("f", [7, 8, 9], 4, [30, 31])]
    ex.execute(SchedulerOutput(seqs=rows))
    written = {(r.block_table[r.start_pos // 4], r.start_pos % 4) for r in rows[:4]}
    written |= {(30 + p // 4, p % 4) for p in range(4, 7)}
    assert touched_slots(before, ex.kv_cache.gpu[:, :, :ex.num_gpu_blocks]) == written


def test_capture_all_takes_every_bucket_a_budget_reaches_once(make: Make) -> None:
    ex = make("padded", piecewise_graphs="padded", max_graph_tokens=64)
    pieces = ex.piecewise_graphs
    assert pieces is not None
    assert pieces.capture_all(20) == 9  # 1, 2, 3, 4, 6, 8, 12, 16 and 24
    assert pieces.captured == [24, 16, 12, 8, 6, 4, 3, 2, 1]  # the largest first
    assert pieces.capture_all(20) == 0
    assert pieces.capture_all(1000) == 3  # 32, 48 and 64: up to the 64-token limit
    assert max(pieces.captured) == 64 and len(pieces.captured) == 12
    assert ex.capture_decode_graphs(8, 1000) == 0  # nothing ahead without CUDA graphs
