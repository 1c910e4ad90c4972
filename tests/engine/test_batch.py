"""The flat batch against a per-token reference: every slot, padding and row index as the
plain definition gives it, for ragged schedules of chunks and decodes.

``build_batch`` computes its slots from block tables a row at a time (a serving batch of
256 decodes at 1,000 tokens is 256,000 slots: per-token Python there cost 28 ms per
iteration, benchmarks/graph_inputs.py). The reference here is the definition written
per token, so any shortcut that changes a slot, a padding entry or an order shows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.executors.batch import BatchError, build_batch
from slopilot.engine.outputs import ScheduledSeq
from slopilot.engine.request import SamplingParams

BLOCKS = 64
MAX_LEN = 200
CPU = torch.device("cpu")


def reference(seqs: list[ScheduledSeq], bs: int,
              targets: dict[str, list[int]] | None) -> dict[str, Any]:
    ids: list[int] = []
    positions: list[int] = []
    new_slots: list[int] = []
    singles: list[int] = []
    single_ctx: list[list[int]] = []
    chunks: list[tuple[int, int, list[int], int]] = []
    logits_rows: list[int] = []
    prompt_rows: list[int] = []
    for seq in seqs:
        end = seq.start_pos + seq.num_tokens
        ctx = [seq.block_table[p // bs] * bs + p % bs for p in range(end)]
        begin = len(ids)
        ids += seq.token_ids
        positions += range(seq.start_pos, end)
        new_slots += ctx[seq.start_pos:]
        if seq.num_tokens == 1:
            singles.append(begin)
            single_ctx.append(ctx)
        else:
            chunks.append((begin, begin + seq.num_tokens, ctx, seq.start_pos))
        if seq.sample:
            logits_rows.append(begin + seq.num_tokens - 1)
        wanted = (targets or {}).get(seq.request_id)
        if wanted:
            prompt_rows += range(begin, begin + min(len(wanted), seq.num_tokens))
    width = max((len(c) for c in single_ctx), default=0)
    return {"ids": ids, "positions": positions, "slots": new_slots, "singles": singles,
            "single_slots": [c + [c[0]] * (width - len(c)) for c in single_ctx],
            "lengths": [len(c) for c in single_ctx], "chunks": chunks,
            "logits_rows": logits_rows + prompt_rows}


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[ScheduledSeq], int, dict[str, list[int]]]:
    bs = draw(st.sampled_from([1, 4, 16]))
    free = list(range(BLOCKS))
    draw(st.randoms()).shuffle(free)
    seqs: list[ScheduledSeq] = []
    targets: dict[str, list[int]] = {}
    for i in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, 40))
        n = draw(st.sampled_from([1, 1, 2, 5, 17]))
        needed = -(-(start + n) // bs)
        if needed > len(free):
            break
        spare = draw(st.integers(0, min(2, len(free) - needed)))  # tables may run longer
        table, free = free[:needed + spare], free[needed + spare:]
        rid = f"r{i}"
        seqs.append(ScheduledSeq(rid, list(range(100 + i, 100 + i + n)), start, table,
                                 draw(st.booleans()), SamplingParams(max_tokens=4)))
        if draw(st.booleans()):
            targets[rid] = list(range(draw(st.integers(1, 20))))
    return seqs, bs, targets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_the_flat_batch_is_the_per_token_definition(
        case: tuple[list[ScheduledSeq], int, dict[str, list[int]]]) -> None:
    seqs, bs, targets = case
    if not seqs:
        return
    want = reference(seqs, bs, targets)
    got = build_batch(seqs, block_size=bs, num_blocks=BLOCKS, max_model_len=MAX_LEN,
                      device=CPU, prompt_logprob_targets=targets)
    att = got.attention
    assert got.input_ids.tolist() == want["ids"]
    assert got.positions.tolist() == want["positions"]
    assert att.slot_mapping.tolist() == want["slots"]
    assert got.logits_rows.tolist() == want["logits_rows"]
    assert [s.request_id for s in got.sample_seqs] == [s.request_id for s in seqs if s.sample]
    if want["singles"]:
        assert att.single_rows is not None
        assert att.single_rows.tolist() == want["singles"]
        assert att.single_slots.tolist() == want["single_slots"]
        assert att.single_lengths.tolist() == want["lengths"]
    else:
        assert att.single_rows is None
    assert len(att.chunks) == len(want["chunks"])
    for chunk, (begin, stop, ctx, start) in zip(att.chunks, want["chunks"], strict=True):
        assert (chunk.begin, chunk.end) == (begin, stop)
        assert chunk.ctx_slots.tolist() == ctx
        if start == 0:
            assert chunk.mask is None
        else:
            assert chunk.mask is not None
            q = torch.arange(start, start + stop - begin)
            assert torch.equal(chunk.mask, torch.arange(len(ctx))[None, :] <= q[:, None])
    for t in (got.input_ids, got.positions, att.slot_mapping, got.logits_rows):
        assert t.dtype == torch.long


def row(rid: str, start: int, table: list[int], n: int = 1) -> ScheduledSeq:
    return ScheduledSeq(rid, [5] * n, start, table, True, SamplingParams(max_tokens=4))


@pytest.mark.parametrize(("seqs", "message"), [
    ([row("ok", 0, [1]), row("far", 5, [2, 70])], r"request far: block ids \[70\] are "
     "outside the cache's 64 blocks"),
    ([row("neg", 0, [-1], n=3)], r"request neg: block ids \[-1\]"),
    ([row("ok", 0, [1]), row("short", 8, [3])], "request short: positions up to 9 need 3"),
    ([row("long", 199, [0] * 50, n=2)], "outside the model's context of 200"),
    ([ScheduledSeq("none", [], 0, [0], True, SamplingParams())], "has no tokens"),
])
def test_a_row_the_cache_cannot_hold_is_named(seqs: list[ScheduledSeq], message: str) -> None:
    with pytest.raises(BatchError, match=message):
        build_batch(seqs, block_size=4, num_blocks=BLOCKS, max_model_len=MAX_LEN, device=CPU)


def test_block_ids_past_a_rows_positions_are_not_judged() -> None:
    # A block table may hold blocks allocated ahead of the positions scheduled now; only
    # the blocks the row's positions use must lie in the cache.
    batch = build_batch([row("ahead", 2, [3, 999])], block_size=4, num_blocks=BLOCKS,
                        max_model_len=MAX_LEN, device=CPU)
    assert batch.attention.slot_mapping.tolist() == [14]
