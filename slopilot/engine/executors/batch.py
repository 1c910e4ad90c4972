"""Turn a ``SchedulerOutput`` into the flat tensors one forward pass needs.

Rows are concatenated in schedule order. Each new token gets a slot in the paged cache
(``block * block_size + offset``); attention then reads every cached position of its row
through the same mapping. Built once per iteration and shared by all layers::

    flat tokens   | r0 chunk (5) | r1 (1) | r2 (1) | r3 chunk (3) |
    single rows   r1, r2   -> one padded attention call, mask hides the padding
    chunks        r0, r3   -> one attention call each, causal within the chunk
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from slopilot.engine.outputs import ScheduledSeq


class BatchError(ValueError):
    """A scheduled row does not fit its block table or the model's context."""


@dataclass(slots=True)
class ChunkAttention:
    begin: int
    end: int
    ctx_slots: torch.Tensor
    # [chunk, ctx] True where attention is allowed; None means a plain causal mask
    # (the chunk starts at position 0, so queries and keys line up).
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionBatch:
    slot_mapping: torch.Tensor
    single_rows: torch.Tensor | None = None
    single_slots: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    # Each single row's context length (its unpadded share of single_slots).
    single_lengths: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    chunks: list[ChunkAttention] = field(default_factory=list)


@dataclass(slots=True)
class FlatBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    # Flat index of the last token of every row that samples, and whose row it is;
    # then, for rows that want prompt logprobs, every position that predicts a prompt
    # token (``prompt_seqs``, in order, each with its number of positions).
    logits_rows: torch.Tensor
    sample_seqs: list[ScheduledSeq]
    prompt_seqs: list[tuple[ScheduledSeq, int]] = field(default_factory=list)


def row_blocks(seq: ScheduledSeq, *, block_size: int, num_blocks: int,
               max_model_len: int, check_ids: bool = True) -> list[int]:
    """The blocks holding the row's positions up to its last new token, checked.

    ``check_ids=False`` leaves the block ids' range to the caller, which judges a whole
    batch's at once (``check_block_ids``).
    """
    if seq.num_tokens == 0:
        raise BatchError(f"request {seq.request_id}: a scheduled row has no tokens")
    end = seq.start_pos + seq.num_tokens
    if seq.start_pos < 0 or end > max_model_len:
        raise BatchError(
            f"request {seq.request_id}: positions [{seq.start_pos}, {end}) are outside "
            f"the model's context of {max_model_len} tokens; cap prompt plus max_tokens")
    needed = -(-end // block_size)
    if len(seq.block_table) < needed:
        raise BatchError(
            f"request {seq.request_id}: positions up to {end} need {needed} blocks of "
            f"{block_size} tokens, but its block table has {len(seq.block_table)}; "
            "the scheduler must allocate blocks before scheduling the tokens")
    table = seq.block_table[:needed]
    if check_ids:
        _check_ids(seq, table, num_blocks)
    return table


def _check_ids(seq: ScheduledSeq, table: list[int], num_blocks: int) -> None:
    bad = [b for b in table if not 0 <= b < num_blocks]
    if bad:
        raise BatchError(
            f"request {seq.request_id}: block ids {bad} are outside the cache's "
            f"{num_blocks} blocks; the block manager and the executor disagree on "
            "num_gpu_blocks")


def block_matrix(tables: Sequence[list[int]], columns: int, fill: int) -> np.ndarray:
    """``tables`` as rows of ``columns`` block ids, each padded with ``fill``.

    One C-level copy per row: per-element Python over a batch's block tables is what
    made the host side of a 256-row decode cost milliseconds.
    """
    out = np.full((len(tables), columns), fill, dtype=np.int64)
    for i, table in enumerate(tables):
        out[i, :len(table)] = table
    return out


def check_block_ids(seqs: Sequence[ScheduledSeq], matrix: np.ndarray, used: np.ndarray,
                    num_blocks: int) -> None:
    """Raise the first row's BatchError whose used blocks (``matrix[i, :used[i]]``) are
    not all among the cache's ``num_blocks``."""
    inside = (matrix >= 0) & (matrix < num_blocks)
    inside |= np.arange(matrix.shape[1])[None, :] >= used[:, None]
    if not inside.all():
        i = int(np.flatnonzero(~inside.all(axis=1))[0])
        _check_ids(seqs[i], matrix[i, :used[i]].tolist(), num_blocks)


def context_slots(matrix: np.ndarray, block_size: int, width: int) -> np.ndarray:
    """Each row's cache slot for every position below ``width``: block * size + offset."""
    slots = matrix[:, :, None] * block_size + np.arange(block_size)
    return slots.reshape(matrix.shape[0], -1)[:, :width]


def build_batch(seqs: list[ScheduledSeq], *, block_size: int, num_blocks: int,
                max_model_len: int, device: torch.device,
                prompt_logprob_targets: dict[str, list[int]] | None = None) -> FlatBatch:
    bs = block_size
    tables = [row_blocks(seq, block_size=bs, num_blocks=num_blocks,
                         max_model_len=max_model_len, check_ids=False) for seq in seqs]
    matrix = block_matrix(tables, max((len(t) for t in tables), default=0), 0)
    check_block_ids(seqs, matrix, np.array([len(t) for t in tables], dtype=np.int64),
                    num_blocks)
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    logits_rows: list[int] = []
    sample_seqs: list[ScheduledSeq] = []
    singles: list[int] = []  # indices into seqs
    single_rows: list[int] = []  # their flat token indices
    chunks: list[tuple[np.ndarray, int, int, int]] = []  # (context slots, begin, end, start)
    prompt_rows: list[int] = []
    prompt_seqs: list[tuple[ScheduledSeq, int]] = []
    for i, seq in enumerate(seqs):
        n = seq.num_tokens
        start, end = seq.start_pos, seq.start_pos + n
        begin = len(input_ids)
        input_ids.extend(seq.token_ids)
        positions.extend(range(start, end))
        if n == 1:
            table = tables[i]
            slot_mapping.append(table[start // bs] * bs + start % bs)
            singles.append(i)
            single_rows.append(begin)
        else:
            # The chunk's context slots hold its new tokens' slots too: computed once.
            ctx = context_slots(matrix[i:i + 1], bs, end)[0]
            slot_mapping.extend(ctx[start:].tolist())
            chunks.append((ctx, begin, begin + n, start))
        if seq.sample:
            logits_rows.append(begin + n - 1)
            sample_seqs.append(seq)
        targets = prompt_logprob_targets.get(seq.request_id) if prompt_logprob_targets \
            else None
        if targets:
            # Position start_pos + j predicts target j; there is at most one per token.
            count = min(len(targets), n)
            prompt_rows.extend(range(begin, begin + count))
            prompt_seqs.append((seq, count))

    def tensor(values: list[int] | np.ndarray) -> torch.Tensor:
        if isinstance(values, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(values)).to(device)
        return torch.tensor(values, dtype=torch.long, device=device)

    attention = AttentionBatch(slot_mapping=tensor(slot_mapping))
    if singles:
        lengths = np.array([seqs[i].start_pos + 1 for i in singles], dtype=np.int64)
        width = int(lengths.max())
        slots = context_slots(matrix[singles], bs, width)
        # Padding repeats a slot of the row itself: masked scores still multiply their
        # values by zero, and only a real, finite entry keeps that zero (0 * NaN is NaN).
        padded = np.where(np.arange(width)[None, :] < lengths[:, None], slots, slots[:, :1])
        attention.single_rows = tensor(single_rows)
        attention.single_slots = tensor(padded)
        attention.single_lengths = tensor(lengths)
    for ctx, begin, stop, start in chunks:
        mask = None
        if start > 0:
            q_pos = torch.arange(start, start + stop - begin, device=device)
            mask = torch.arange(len(ctx), device=device)[None, :] <= q_pos[:, None]
        attention.chunks.append(ChunkAttention(begin, stop, tensor(ctx), mask))
    return FlatBatch(
        input_ids=tensor(input_ids), positions=tensor(positions), attention=attention,
        logits_rows=tensor(logits_rows + prompt_rows), sample_seqs=sample_seqs,
        prompt_seqs=prompt_seqs)
