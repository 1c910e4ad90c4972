"""The prefix cache: collision-resistant keys, per-request salts, a live on/off switch."""

from __future__ import annotations

import sys

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.kv_integrity import check_block_manager
from slopilot.engine.prefix_cache import PrefixCache
from slopilot.engine.request import Request, SamplingParams
from tests.engine.helpers import make_engine, make_request, make_scheduler, step

BS = 16


def _computed(kv: BlockManager, req: Request) -> None:
    """Allocate and "compute" the whole prompt, then offer its full blocks to the cache."""
    assert kv.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)


def test_a_python_hash_collision_does_not_share_blocks() -> None:
    # hash(n) == hash(n + modulus) for ints, so hash()-keyed blocks of these two prompts
    # collide; a tenant who can craft that reads another tenant's KV.
    kv = BlockManager(num_gpu_blocks=16, block_size=BS)
    victim = Request("victim", list(range(100, 100 + 2 * BS)) + [7])
    _computed(kv, victim)
    forged = list(victim.prompt_token_ids)
    forged[0] += sys.hash_info.modulus
    assert hash(tuple(forged[:BS])) == hash(tuple(victim.prompt_token_ids[:BS]))
    assert kv.find_cached_prefix(Request("attacker", forged)) == []
    # The honest twin still shares both full blocks.
    assert len(kv.find_cached_prefix(Request("twin", list(victim.prompt_token_ids)))) == 2


def test_blocks_are_shared_only_within_one_cache_salt() -> None:
    kv = BlockManager(num_gpu_blocks=32, block_size=BS)
    prompt = list(range(3 * BS)) + [1]
    _computed(kv, Request("a", prompt, cache_salt="tenant-a"))
    assert len(kv.find_cached_prefix(Request("a2", prompt, cache_salt="tenant-a"))) == 3
    assert kv.find_cached_prefix(Request("b", prompt, cache_salt="tenant-b")) == []
    assert kv.find_cached_prefix(Request("nosalt", prompt)) == []
    assert kv.find_cached_prefix(Request("empty", prompt, cache_salt="")) == []
    check_block_manager(kv)


def test_prefix_caching_switched_off_live_is_off_in_the_block_manager() -> None:
    engine = make_engine(num_blocks=64)
    sched = engine.scheduler

    def run(rid: str) -> int:
        before = sched.prefix_hits
        engine.add_request(make_request(rid, 3 * BS + 1, max_tokens=2))
        engine.run_until_idle()
        return sched.prefix_hits - before

    assert run("first") == 0
    assert run("second") == 3 * BS
    sched.update_config(engine.config.with_overrides({"enable_prefix_caching": False}))
    assert sched.kv.enable_prefix_caching is False
    assert sched.kv.stats().num_cached == 0  # what was cached is forgotten, not hidden
    assert run("third") == 0
    assert run("fourth") == 0
    sched.update_config(engine.config.with_overrides({"enable_prefix_caching": True}))
    assert sched.kv.enable_prefix_caching is True
    assert run("fifth") == 0
    assert run("sixth") == 3 * BS
    sched.check_integrity()


def test_switching_off_while_requests_run_takes_effect_at_the_next_iteration() -> None:
    engine = make_engine(num_blocks=64)
    sched = engine.scheduler
    engine.add_request(make_request("long", 3 * BS + 1, max_tokens=50))
    engine.step()
    sched.update_config(engine.config.with_overrides({"enable_prefix_caching": False}))
    assert sched.kv.enable_prefix_caching is True  # staged, like every live knob
    engine.step()
    assert sched.kv.enable_prefix_caching is False
    engine.run_until_idle()
    assert sched.kv.num_used_blocks == 0 and sched.kv.stats().num_cached == 0
    sched.check_integrity()


def test_a_huge_pool_costs_nothing_until_used() -> None:
    kv = BlockManager(num_gpu_blocks=32_600_000, block_size=BS)
    assert kv.num_free_blocks == 32_600_000
    req = Request("a", list(range(40)))
    assert kv.allocate_slots(req, 40)
    assert kv.num_used_blocks == 3 and kv.block_table("a") == [0, 1, 2]
    check_block_manager(kv)  # touches the 3 blocks ever used, not 32.6 million
    kv.free("a")
    assert kv.num_used_blocks == 0


def test_keys_follow_the_documented_recipe() -> None:
    # root(salt) || tokens, then "n" + node || tokens: what prefix_cache.py says.
    from slopilot.engine.prefix_cache import block_packer, node_prefix, root_prefix

    kv = BlockManager(num_gpu_blocks=16, block_size=4)
    req = Request("a", list(range(9)), cache_salt="s")
    _computed(kv, req)
    pack = block_packer(4)
    k0 = root_prefix("s") + pack(0, 1, 2, 3)
    node0 = kv.prefix.index[k0][1]
    assert node0 in (node_prefix(0), node_prefix(1))
    k1 = node0 + pack(4, 5, 6, 7)
    assert kv.prefix.index.keys() == {k0, k1}
    assert root_prefix(None) != root_prefix("") != root_prefix("r")


def test_concurrent_twins_keep_matching_after_a_private_block() -> None:
    # Two requests compute the same prompt at once: the second one's blocks stay
    # private, but a third request still finds the whole prefix.
    kv = BlockManager(num_gpu_blocks=32, block_size=4)
    prompt = list(range(12)) + [99]
    a, b = Request("a", prompt), Request("b", prompt)
    for r in (a, b):
        assert kv.allocate_slots(r, r.num_tokens)
    for r in (b, a):
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
    assert kv.find_cached_prefix(Request("c", prompt)) == kv.block_table("b")[:3]
    kv.free("b")
    kv.free("a")
    check_block_manager(kv)


def test_switching_off_and_on_rekeys_a_shared_block_without_a_stale_key() -> None:
    # a, b and c share a 2-block prefix; b and c also share b's third block (c hit it).
    # Off drops every key; on again, b re-keys its blocks from the root, so the shared
    # third block is keyed under b's private chain. Once b's private blocks are evicted,
    # c re-keys the same block under its own chain: the block's first key must go.
    kv = BlockManager(num_gpu_blocks=8, block_size=4)
    shared = list(range(12))
    a = Request("a", shared[:8] + [99])
    b = Request("b", shared + [7])
    for r in (a, b):  # computed side by side: b's first two blocks stay private
        assert kv.allocate_slots(r, r.num_tokens)
    for r in (a, b):
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
    c = Request("c", shared + [5])
    hits = kv.find_cached_prefix(c)
    assert hits == kv.block_table("a")[:2] + kv.block_table("b")[2:3]
    assert kv.allocate_slots(c, 1, hits)
    c.num_computed_tokens = c.num_tokens
    kv.free("a")
    kv.set_prefix_caching(False)
    kv.set_prefix_caching(True)
    kv.cache_full_blocks(b)  # re-keys b0, b1 and the shared block from the root
    kv.free("b")  # b0, b1 and b's tail are cached; the shared block is held by c
    filler = Request("filler", list(range(500, 500 + 4 * kv.num_free_blocks)))
    assert kv.allocate_slots(filler, filler.num_tokens)  # evicts every cached block
    kv.cache_full_blocks(c)  # c re-keys a0, a1 and the shared block from the root
    check_block_manager(kv)
    # The shared block is found again through c's prefix, and only through it.
    assert kv.find_cached_prefix(Request("d", shared + [1])) == kv.block_table("c")[:3]
    kv.free("c")
    kv.free("filler")
    check_block_manager(kv)


def test_prefix_caching_off_and_on_live_keeps_the_index_consistent() -> None:
    # The outside review's repro through the scheduler: c hits a's and b's blocks, the
    # switch goes off and on, b finishes and is evicted, then c fills a block.
    sched = make_scheduler(num_blocks=10, block_size=8, token_budget=256,
                           chunk_size=256, kv_watermark=0.0)
    prefix = list(range(1, 41))

    def add(rid: str, prompt: list[int], max_tokens: int) -> None:
        sched.add_request(Request(rid, prompt,
                                  SamplingParams(max_tokens=max_tokens, ignore_eos=True)))

    def run(n: int) -> None:
        for _ in range(n):
            step(sched)
            sched.check_integrity()

    add("a", prefix[:17], 1)  # caches a0, a1
    add("b", prefix[:24] + [7] * 4, 6)  # private copies of a0, a1; caches b2
    run(1)
    add("c", prefix[:24] + [999], 20)  # hits a0, a1, b2
    run(1)
    sched.update_config(sched.config.with_overrides({"enable_prefix_caching": False}))
    run(1)
    sched.update_config(sched.config.with_overrides({"enable_prefix_caching": True}))
    run(3)  # b fills a block (re-registering from the root), then finishes
    add("d", list(range(500, 540)), 1)  # evicts b's cached blocks
    run(6)  # c fills a block: re-registers from the root over b2
    while sched.has_work():  # c decodes to the end, checked at every step
        run(1)
    assert sched.kv.num_used_blocks == 0


def test_a_block_reached_by_a_second_path_moves_its_key_and_keeps_its_node() -> None:
    # x cached four blocks, then its first was evicted; y caches the same prefix again
    # from the root, and its table holds x's second and third blocks. Each keeps one
    # key, now on y's path, and x's fourth block, keyed after x's third, is found still.
    pc = PrefixCache(block_size=4, enabled=True)
    pc.keys.extend([None] * 8)
    prompt = list(range(17))
    x = Request("x", prompt)
    x.num_computed_tokens = 16
    pc.register(x, [0, 1, 2, 3])
    pc.evict(0)
    y = Request("y", prompt[:12] + [99])
    y.num_computed_tokens = 12
    pc.register(y, [5, 1, 2])
    assert pc.lookup(Request("z", prompt)) == [5, 1, 2, 3]
    assert {b: key for key, (b, _) in pc.index.items()} == {
        b: key for b, key in enumerate(pc.keys) if key is not None}
