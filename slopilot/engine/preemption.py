"""Preemption policy: how a victim gives its KV blocks back.

Recompute throws the KV away (cheap for short contexts, and the prefix cache often
gives most of it back); swap copies it to host memory over PCIe (cheap to resume for
long contexts, but the copy itself takes time). ``auto`` picks per victim.
"""

from __future__ import annotations

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.request import Request


def choose_mode(config: EngineConfig, kv: BlockManager, victim: Request,
                swap_s_per_block: float, *, newcomer: bool) -> PreemptionMode | None:
    """The mode to preempt ``victim`` with, or None when it must not be preempted.

    A swap estimated above ``swap_timeout_ms`` never happens: every running request
    would stall behind the copy. ``swap_s_per_block`` is the scheduler's estimate
    (``swap_cost.py``): the executor's guess, soon outweighed by what its recent
    swap-outs took a block. For a newcomer (a waiting P0) that means no preemption, and
    the newcomer waits (None). A running request that needs room to grow cannot wait on
    nobody, or the batch could deadlock, so it gets a recompute.
    """
    mode = _policy_mode(config, victim)
    if mode is PreemptionMode.SWAP:
        if not kv.can_swap_out(victim.request_id):
            # No host room: recomputing is the only way to free the blocks.
            return PreemptionMode.RECOMPUTE
        if _over_timeout(config, kv, victim, swap_s_per_block):
            return None if newcomer else PreemptionMode.RECOMPUTE
    return mode


def swap_refused(config: EngineConfig, kv: BlockManager, victim: Request,
                 swap_s_per_block: float) -> bool:
    """Whether ``choose_mode`` turns ``victim``'s swap away for its estimated time alone:
    the estimate then learns nothing from it, which ``SwapCost.observe_refusal`` counts."""
    return (_policy_mode(config, victim) is PreemptionMode.SWAP
            and kv.can_swap_out(victim.request_id)
            and _over_timeout(config, kv, victim, swap_s_per_block))


def _policy_mode(config: EngineConfig, victim: Request) -> PreemptionMode:
    mode = config.preemption_mode
    if mode is PreemptionMode.AUTO:
        return (PreemptionMode.RECOMPUTE
                if victim.num_computed_tokens < config.recompute_max_tokens
                else PreemptionMode.SWAP)
    return mode


def _over_timeout(config: EngineConfig, kv: BlockManager, victim: Request,
                  swap_s_per_block: float) -> bool:
    swap_ms = kv.num_blocks(victim.request_id) * swap_s_per_block * 1000.0
    return swap_ms > config.swap_timeout_ms
