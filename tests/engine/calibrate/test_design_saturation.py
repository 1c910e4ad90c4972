"""The grid covers the batches a server runs near saturation: many decodes of ragged,
long contexts, alone and with a chunk, up to max_num_seqs x max_context padded."""

from __future__ import annotations

import pytest

from slopilot.engine.calibrate.design import GridOptions, design

GRIDS = [GridOptions(), GridOptions(token_budget=256, max_num_seqs=16, max_context=512,
                                    quick=True)]


@pytest.mark.parametrize("opts", GRIDS, ids=["full", "quick"])
def test_the_largest_padded_decode_batch_is_timed(opts: GridOptions) -> None:
    specs = design(opts)
    largest = max(s.shape.decode_padded_context for s in specs)
    assert largest == opts.max_num_seqs * opts.max_context
    # Not only one: a spread of large batches, so a term beyond a knee has points.
    large = [s for s in specs
             if s.shape.decode_padded_context >= opts.max_num_seqs * opts.max_context // 4
             and s.shape.decode_seqs >= opts.max_num_seqs // 2]
    assert len(large) >= (8 if not opts.quick else 4)


@pytest.mark.parametrize("opts", GRIDS, ids=["full", "quick"])
def test_large_batches_are_ragged_as_served(opts: GridOptions) -> None:
    for s in design(opts):
        if s.group != "large":
            continue
        contexts = sorted(c for n, c, _ in s.rows if n == 1)
        # Contexts spread from short to long: the sum is well below the padded size.
        assert contexts[0] <= 16 and contexts[-1] >= opts.max_context // 2 - 1
        assert s.shape.decode_context < 0.7 * s.shape.decode_padded_context


@pytest.mark.parametrize("opts", GRIDS, ids=["full", "quick"])
def test_mixed_batches_near_saturation(opts: GridOptions) -> None:
    mixed = [s for s in design(opts) if s.group == "large mixed"]
    assert mixed
    assert max(s.shape.decode_seqs for s in mixed) == opts.max_num_seqs
    assert max(s.shape.decode_padded_context for s in mixed) == (
        opts.max_num_seqs * opts.max_context)
    for s in mixed:
        assert s.shape.prefill_seqs == 1 and s.shape.tokens <= opts.token_budget
        assert all(n + c <= opts.max_context for n, c, _ in s.rows)


@pytest.mark.parametrize("opts", GRIDS + [GridOptions(token_budget=128, max_num_seqs=4,
                                                      max_context=256, quick=True)],
                         ids=["full", "quick", "tiny"])
def test_several_chunks_with_decodes_are_timed_as_served(opts: GridOptions) -> None:
    # Near saturation most iterations hold prompt heads and tails together beside the
    # decodes; one chunk at a time priced their attention calls 10-13 % high.
    served = [s for s in design(opts) if s.group == "multi mixed"]
    assert len(served) >= (2 if opts.quick else 6)
    for s in served:
        chunks = [(n, c) for n, c, _ in s.rows if n > 1]
        decodes = [c for n, c, _ in s.rows if n == 1]
        assert len(chunks) >= 2 and decodes
        assert len({c for _, c in chunks}) == len(chunks)  # heads and tails, not one kind
        assert any(c == 0 for _, c in chunks) and any(c > 0 for _, c in chunks)
        assert s.shape.tokens <= opts.token_budget
        assert len(decodes) <= opts.max_num_seqs
        assert all(c + n <= opts.max_context for n, c in chunks)
    assert max(len([r for r in s.rows if r[0] > 1]) for s in served) >= 4
