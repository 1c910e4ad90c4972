"""Turn a ``SchedulerOutput`` into the flat tensors one forward pass needs.

Rows are concatenated in schedule order. Each new token gets a slot in the paged cache
(``block * block_size + offset``); attention then reads every cached position of its row
through the same mapping. Built once per iteration and shared by all layers::

    flat tokens   | r0 chunk (5) | r1 (1) | r2 (1) | r3 chunk (3) |
    single rows   r1, r2   -> one padded attention call, mask hides the padding
    chunks        r0, r3   -> one attention call each, causal within the chunk
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
               max_model_len: int) -> list[int]:
    """The blocks holding the row's positions up to its last new token, checked."""
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
    bad = [b for b in table if not 0 <= b < num_blocks]
    if bad:
        raise BatchError(
            f"request {seq.request_id}: block ids {bad} are outside the cache's "
            f"{num_blocks} blocks; the block manager and the executor disagree on "
            "num_gpu_blocks")
    return table


def _slots(seq: ScheduledSeq, block_size: int, num_blocks: int,
           max_model_len: int) -> list[int]:
    table = row_blocks(seq, block_size=block_size, num_blocks=num_blocks,
                       max_model_len=max_model_len)
    end = seq.start_pos + seq.num_tokens
    return [table[p // block_size] * block_size + p % block_size for p in range(end)]


def build_batch(seqs: list[ScheduledSeq], *, block_size: int, num_blocks: int,
                max_model_len: int, device: torch.device,
                prompt_logprob_targets: dict[str, list[int]] | None = None) -> FlatBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    logits_rows: list[int] = []
    sample_seqs: list[ScheduledSeq] = []
    single_rows: list[int] = []
    single_ctx: list[list[int]] = []
    chunks: list[tuple[int, int, list[int], int]] = []
    prompt_rows: list[int] = []
    prompt_seqs: list[tuple[ScheduledSeq, int]] = []
    for seq in seqs:
        ctx = _slots(seq, block_size, num_blocks, max_model_len)
        n = seq.num_tokens
        end = seq.start_pos + n
        begin = len(input_ids)
        input_ids.extend(seq.token_ids)
        positions.extend(range(seq.start_pos, end))
        slot_mapping.extend(ctx[seq.start_pos:])
        if n == 1:
            single_rows.append(begin)
            single_ctx.append(ctx)
        else:
            chunks.append((begin, begin + n, ctx, seq.start_pos))
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

    def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    attention = AttentionBatch(slot_mapping=tensor(slot_mapping))
    if single_rows:
        width = max(len(c) for c in single_ctx)
        # Padding repeats a slot of the row itself: masked scores still multiply their
        # values by zero, and only a real, finite entry keeps that zero (0 * NaN is NaN).
        padded = [c + [c[0]] * (width - len(c)) for c in single_ctx]
        lengths = torch.tensor([len(c) for c in single_ctx], device=device)
        attention.single_rows = tensor(single_rows)
        attention.single_slots = tensor(padded)
        attention.single_lengths = lengths
    for begin, stop, ctx, start in chunks:
        mask = None
        if start > 0:
            q_pos = torch.arange(start, start + stop - begin, device=device)
            mask = torch.arange(len(ctx), device=device)[None, :] <= q_pos[:, None]
        attention.chunks.append(ChunkAttention(begin, stop, tensor(ctx), mask))
    return FlatBatch(
        input_ids=tensor(input_ids), positions=tensor(positions), attention=attention,
        logits_rows=tensor(logits_rows + prompt_rows), sample_seqs=sample_seqs,
        prompt_seqs=prompt_seqs)
