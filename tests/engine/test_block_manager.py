"""KV block manager: allocation, prefix cache (hash chain, LRU eviction), swap, integrity."""

from __future__ import annotations

import pytest

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.kv_integrity import IntegrityError, check_block_manager
from slopilot.engine.request import Request


def req(rid: str, tokens: list[int], computed: int = 0) -> Request:
    r = Request(rid, tokens)
    r.num_computed_tokens = computed
    return r


def test_allocate_answers_yes_or_no_and_changes_nothing_on_no() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4)
    a = req("a", list(range(10)))
    assert kv.allocate_slots(a, 10)  # 3 blocks
    b = req("b", list(range(100, 108)))
    before = kv.stats()
    assert not kv.allocate_slots(b, 8)  # needs 2, 1 free
    assert kv.stats() == before and kv.num_blocks("b") == 0
    assert not kv.allocate_slots(req("c", [1]), 1, reserve_blocks=1)
    check_block_manager(kv)


def test_prefix_is_shared_only_when_the_whole_prefix_matches() -> None:
    kv = BlockManager(num_gpu_blocks=16, block_size=4)
    a = req("a", list(range(12)) + [99])
    assert kv.allocate_slots(a, 13)
    a.num_computed_tokens = 13
    kv.cache_full_blocks(a)
    same = req("same", list(range(12)) + [7])
    assert kv.find_cached_prefix(same) == kv.block_table("a")[:3]
    # Same second block, different first block: the chain differs, nothing is shared.
    other = req("other", [50, 51, 52, 53] + list(range(4, 12)) + [7])
    assert kv.find_cached_prefix(other) == []
    # A prompt that is exactly cached keeps its last token to compute.
    exact = req("exact", list(range(12)))
    assert len(kv.find_cached_prefix(exact)) == 2


def test_shared_blocks_are_reference_counted() -> None:
    kv = BlockManager(num_gpu_blocks=8, block_size=4)
    a = req("a", list(range(9)))
    kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    kv.cache_full_blocks(a)
    b = req("b", list(range(8)) + [42])
    hits = kv.find_cached_prefix(b)
    assert kv.allocate_slots(b, 1, hits)
    # What preempting one would give back (a P0 judges its room by it): its own block.
    assert kv.num_blocks("a") == kv.num_blocks("b") == 3
    assert kv.num_exclusive_blocks("a") == kv.num_exclusive_blocks("b") == 1
    used = kv.num_used_blocks
    kv.free("a")
    assert kv.num_used_blocks == used - 1  # only a's private tail block is released
    kv.free("b")
    assert kv.num_used_blocks == 0
    assert kv.stats().num_cached == 2
    check_block_manager(kv)


def test_cached_blocks_are_evicted_least_recently_freed_tail_first() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4)
    a = req("a", list(range(16)) + [1])
    kv.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    kv.cache_full_blocks(a)
    head = kv.block_table("a")[0]
    kv.free("a")  # 4 cached blocks, tail freed first
    b = req("b", list(range(200, 212)))
    assert kv.allocate_slots(b, 12)  # takes 3 blocks: evicts a's three tail blocks
    assert head not in kv.block_table("b")
    again = req("again", list(range(16)) + [1])
    assert kv.find_cached_prefix(again) == [head]


def test_swap_out_and_in_moves_blocks_through_the_cpu_pool() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=4)
    a = req("a", list(range(10)), computed=0)
    kv.allocate_slots(a, 10)
    gpu = list(kv.block_table("a"))
    pairs = kv.swap_out("a")
    assert [g for g, _ in pairs] == gpu and kv.is_swapped("a")
    assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == 1
    back = kv.swap_in("a")
    assert back is not None and [c for c, _ in back] == [c for _, c in pairs]
    assert kv.num_blocks("a") == 3
    # The CPU blocks just read stay reserved until the next iteration begins.
    assert kv.num_free_cpu_blocks == 1
    kv.begin_step()
    assert kv.num_free_cpu_blocks == 4
    check_block_manager(kv)


def test_swap_refusals() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=1)
    kv.allocate_slots(req("a", list(range(10))), 10)
    assert not kv.can_swap_out("a")
    with pytest.raises(ValueError, match="not enough CPU blocks"):
        kv.swap_out("a")
    with pytest.raises(ValueError, match="not swapped out"):
        kv.swap_in("a")


def test_swap_out_fits_a_cpu_pool_of_exactly_its_blocks() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=3)
    kv.allocate_slots(req("a", list(range(10))), 10)  # 3 blocks
    assert kv.can_swap_out("a")
    assert len(kv.swap_out("a")) == 3 and kv.num_free_cpu_blocks == 0


def test_swap_in_keeps_the_reserve_free() -> None:
    """``reserve_blocks`` (the watermark, or a P0's claim) must stay free after a swap-in,
    as after any allocation."""
    kv = BlockManager(num_gpu_blocks=4, block_size=4, num_cpu_blocks=4)
    kv.allocate_slots(req("a", list(range(10))), 10)  # 3 blocks
    kv.swap_out("a")
    assert kv.swap_in("a", reserve_blocks=2) is None  # 3 + 2 > 4 free: no change
    assert kv.is_swapped("a") and kv.num_used_blocks == 0
    assert kv.swap_in("a", reserve_blocks=1) is not None
    check_block_manager(kv)


def test_integrity_check_catches_corruption() -> None:
    kv = BlockManager(num_gpu_blocks=4, block_size=4)
    kv.allocate_slots(req("a", [1, 2, 3]), 3)
    check_block_manager(kv)
    kv._free.append(kv.block_table("a")[0])  # a block both used and free
    with pytest.raises(IntegrityError):
        check_block_manager(kv)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="need at least one KV block"):
        BlockManager(num_gpu_blocks=0, block_size=16)
    with pytest.raises(ValueError, match="num_cpu_blocks=-1"):
        BlockManager(num_gpu_blocks=1, block_size=16, num_cpu_blocks=-1)
