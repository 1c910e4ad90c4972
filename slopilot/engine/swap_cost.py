"""What swapping a victim out costs per KV block, for ``swap_timeout_ms``.

The check is made before the copy runs, so it needs an estimate; the executor's own
swaps are the best evidence of what the next one will cost. Until the first is timed
the estimate is the executor's guess (``swap_time_per_block_s``: a bandwidth figure on
the torch executor, the cost model's per-block time on the simulated one); from then on
it follows the measured swap-outs.

Why learn from serving rather than time a copy once when the cache is allocated: a
micro-measurement at start sees an idle machine and host pages that were never touched
(a first write faults them in), so it would time page faults, or, on a few warmed
blocks, a call's fixed cost; and it never sees the contention that serving brings (the
same 256-block swap-out of SmolLM2-135M took 16 ms on a quiet 2-core machine and 72 ms
on a busy one, ``benchmarks/swap_copy.py``). The swaps the engine really runs time all
of that, at no cost of their own.

Seconds and blocks are averaged apart (exponentially, by ``weight``) and divided, rather
than averaging each swap's seconds per block: a large swap is the one the timeout is
about, and a one-block swap's fixed cost would otherwise count as much as its blocks.
Only swap-outs teach it: the timeout bounds the stall of preempting a victim now
(``preemption.choose_mode``); its swap-in later is the resume's cost.

Censoring is mild: a high estimate still lets small victims swap, and their timings
pull it back; only one that judges a single block over the timeout stops learning.
"""

from __future__ import annotations

import math

# A swap's weight in the averages: about the last 4-8 swaps count, so a one-off stall
# (a page-fault storm on a cold host pool, a neighbour's burst) fades within a few.
DEFAULT_WEIGHT = 0.25


class SwapCostError(ValueError):
    """A prior or weight that makes no estimate; the message names the value."""


class SwapCost:
    """Seconds per block of a swap-out: the prior until one is timed, then the recent
    timed swap-outs' seconds over their blocks."""

    def __init__(self, prior_s_per_block: float, *, weight: float = DEFAULT_WEIGHT) -> None:
        if not (math.isfinite(prior_s_per_block) and prior_s_per_block >= 0):
            raise SwapCostError(
                f"prior_s_per_block={prior_s_per_block}: must be a finite number of "
                "seconds >= 0 (the executor's guess of one block's copy time)")
        if not 0 < weight <= 1:
            raise SwapCostError(
                f"weight={weight}: must be in (0, 1] (the share of the newest swap in the "
                "average; 1 keeps only the last)")
        self.prior_s_per_block = prior_s_per_block
        self.weight = weight
        self._seconds = 0.0
        self._blocks = 0.0

    @property
    def measured(self) -> bool:
        """Whether a swap-out has been timed (the estimate is no longer the prior)."""
        return self._blocks > 0

    @property
    def per_block_s(self) -> float:
        if self._blocks > 0:
            return self._seconds / self._blocks
        return self.prior_s_per_block

    def observe_swap_out(self, num_blocks: int, seconds: float) -> None:
        """A swap-out of ``num_blocks`` took ``seconds`` (measured, or modelled in the
        twin). A swap of no blocks, or timed as taking no time, teaches nothing."""
        if num_blocks <= 0 or not seconds > 0 or not math.isfinite(seconds):
            return
        if self._blocks == 0:
            # The first timing replaces the prior outright: a guess is no evidence.
            self._seconds, self._blocks = seconds, float(num_blocks)
            return
        w = self.weight
        self._seconds += w * (seconds - self._seconds)
        self._blocks += w * (num_blocks - self._blocks)
