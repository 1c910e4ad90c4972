"""The prefix cache: collision-resistant keys, per-request salts, a live on/off switch."""

from __future__ import annotations

import sys

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.kv_integrity import check_block_manager
from slopilot.engine.request import Request
from tests.engine.helpers import make_engine, make_request

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
