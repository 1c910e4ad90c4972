"""Iteration shapes: the sums the cost model, the fit and the metrics share."""

from __future__ import annotations

import pytest

from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.request import SamplingParams
from slopilot.engine.sim.shape import (
    FEATURES,
    FORM_VERSION,
    GEMM_KNEE_TOKENS,
    IterationShape,
    decode_knee_tokens,
    form_hash,
    shape_of,
    shape_of_rows,
)


def test_a_mixed_batch_sums_rows_by_kind() -> None:
    # Two decodes at contexts 10 and 30, a chunk of 4 after 8 cached, one of 3 that
    # does not sample (mid-prompt).
    s = shape_of_rows([(1, 10, True), (1, 30, True), (4, 8, True), (3, 0, False)])
    assert (s.iteration, s.tokens, s.sampled) == (1, 9, 3)
    assert (s.decode_seqs, s.decode_batches, s.prefill_seqs) == (2, 1, 2)
    assert s.decode_context == 11 + 31
    assert s.decode_padded_context == 2 * 31  # padded to the longest decode
    assert s.prefill_context == 12 + 3
    assert s.prefill_attention == pytest.approx(4 * 8 + 4 * 5 / 2 + 3 * 4 / 2)
    assert s.prefill_attention_dense == 4 * 12 + 3 * 3
    assert (s.prefill_tokens, s.context_tokens, s.kind) == (7, 57, "mixed")


def test_kinds() -> None:
    assert shape_of_rows([(1, 5, True)]).kind == "decode"
    assert shape_of_rows([(16, 0, True)]).kind == "prefill"
    assert shape_of_rows([], swap_out=3).kind == "swap"
    assert shape_of_rows([]) == IterationShape()


def test_shape_of_a_scheduler_output_counts_swaps() -> None:
    sp = SamplingParams()
    out = SchedulerOutput(seqs=[ScheduledSeq("a", [1, 2, 3], 5, [0], True, sp)],
                          swap_out=[(1, 0), (2, 1)], swap_in=[(3, 4)])
    s = shape_of(out)
    assert (s.tokens, s.prefill_seqs, s.swap_batches, s.swap_blocks) == (3, 1, 2, 3)
    assert s.idle_starts == 0
    out.after_idle = True
    assert shape_of(out).idle_starts == 1


def test_shapes_add_up_feature_by_feature() -> None:
    a, b = shape_of_rows([(1, 3, True)]), shape_of_rows([(8, 0, True)])
    assert (a + b).vector() == tuple(x + y for x, y in zip(a.vector(), b.vector(),
                                                           strict=True))
    assert len(a.vector()) == len(FEATURES)


@pytest.mark.parametrize("row", [(0, 0, True), (1, -1, True)])
def test_impossible_rows_are_refused(row: tuple[int, int, bool]) -> None:
    with pytest.raises(ValueError, match="new_tokens >= 1 and context >= 0"):
        shape_of_rows([row])


def test_the_form_hash_is_stable_and_short() -> None:
    assert form_hash() == form_hash() and len(form_hash()) == 16


def test_decode_spill_counts_padded_kv_beyond_the_knee() -> None:
    # 4 decodes padded to 1001 tokens: 4004 padded, 1004 of them beyond a knee of 3000.
    rows = [(1, 1000, True)] + [(1, 10, True)] * 3
    assert shape_of_rows(rows, knee=3000).decode_spill == 4 * 1001 - 3000
    assert shape_of_rows(rows, knee=5000).decode_spill == 0  # fits the cache
    assert shape_of_rows(rows).decode_spill == 0  # no knee known: no spill term
    # Chunks do not count: only the decodes' batched attention is padded.
    assert shape_of_rows([(64, 4000, True)], knee=10).decode_spill == 0


def test_the_engine_stamps_its_knee_on_every_iteration_for_all_who_read_the_shape() -> None:
    sp = SamplingParams()
    out = SchedulerOutput(seqs=[ScheduledSeq(f"r{i}", [1], 99, [0] * 7, True, sp)
                                for i in range(8)])
    out.decode_knee = 500
    assert shape_of(out).decode_spill == 8 * 100 - 500


def test_the_knee_is_the_cache_over_one_layers_kv_bytes_per_token() -> None:
    # SmolLM2-135M in float32: 3 KV heads x 64 x 4 bytes x (K, V) = 1536 B per layer
    # and token; a 32 MiB L3 holds 21845 padded tokens of one layer.
    assert decode_knee_tokens(32 * 1024 ** 2, 1536) == 21845
    assert decode_knee_tokens(None, 1536) is None
    assert decode_knee_tokens(0, 1536) is None


def test_the_form_is_version_4_with_the_knee_spill_and_eager_pass_terms() -> None:
    assert FORM_VERSION == 4 and "decode_spill" in FEATURES and "eager_passes" in FEATURES
    assert FEATURES.index("tokens_past_knee") == FEATURES.index("tokens") + 1
    assert FEATURES.index("decode_spill") == FEATURES.index("decode_padded_context") + 1
    assert FEATURES[-1] == "idle_starts"


@pytest.mark.parametrize(("rows", "graph_batch", "eager", "decode_batches"), [
    ([(1, 99, True)] * 8, None, 0, 1),          # no graphs: no eager passes to count
    ([(1, 99, True)] * 8, 256, 0, 0),           # a replay: no launch-bound attention call
    ([(1, 99, True)] * 8, 4, 1, 1),             # more decodes than the largest graph
    ([(64, 0, True), (1, 99, True)], 256, 1, 1),  # a chunk in the pass: eager
    ([(64, 0, True), (64, 0, False)], 256, 1, 0),
    ([(64, 0, True)], None, 0, 0),
])
def test_eager_passes_count_what_a_graph_device_runs_eagerly(
        rows: list[tuple[int, int, bool]], graph_batch: int | None, eager: int,
        decode_batches: int) -> None:
    shape = shape_of_rows(rows, graph_batch=graph_batch)
    assert (shape.eager_passes, shape.decode_batches) == (eager, decode_batches)
    assert shape_of_rows([], swap_out=2, graph_batch=256).eager_passes == 0
    sp = SamplingParams()
    out = SchedulerOutput(seqs=[ScheduledSeq(f"r{i}", [1] * n, c, [0] * 7, s, sp)
                                for i, (n, c, s) in enumerate(rows)])
    out.graph_batch = graph_batch
    assert shape_of(out) == shape


@pytest.mark.parametrize(("rows", "past"), [
    ([(1, 10, True)] * 8, 0),             # 8 decodes: all within the knee
    ([(1, 10, True)] * 12, 4),            # 12 decodes: 4 past it
    ([(64, 0, False), (1, 5, True)], 57),  # a chunk and a decode: 65 rows, 57 past
    ([(3, 0, True)], 0),
])
def test_tokens_past_the_knee_are_the_passs_rows_beyond_the_first_eight(
        rows: list[tuple[int, int, bool]], past: int) -> None:
    # A linear layer over a few rows reads its weights once for all of them: on this
    # project's CPU 1 to 8 decodes cost 17.1 to 20.5 ms, then about 1 ms a row.
    assert GEMM_KNEE_TOKENS == 8
    shape = shape_of_rows(rows)
    assert shape.tokens_past_knee == past
    assert shape.tokens == sum(n for n, _, _ in rows)
