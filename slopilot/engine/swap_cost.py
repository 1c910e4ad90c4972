"""What swapping a victim out costs per KV block, for ``swap_timeout_ms``.

The check is made before the copy runs, so it needs an estimate; the executor's own
swaps are the best evidence of what the next one will cost. It starts as the executor's
guess (``swap_time_per_block_s``: a bandwidth figure on the torch executor, the cost
model's per-block time on the simulated one) and follows the measured swap-outs.

Why learn from serving rather than time a copy once when the cache is allocated: a
micro-measurement at start sees an idle machine, or, on a few warmed blocks, a call's
fixed cost; and it never sees the contention that serving brings (the same 256-block
swap-out of SmolLM2-135M took 16 ms on a quiet 2-core machine and 72 ms on a busy one,
``benchmarks/swap_copy.py``). The swaps the engine really runs time all of that, at no
cost of their own.

Seconds and blocks are averaged apart (exponentially, by ``weight``) and divided, rather
than averaging each swap's seconds per block: a large swap is the one the timeout is
about, and a one-block swap's fixed cost would otherwise count as much as its blocks.
Only swap-outs teach it: the timeout bounds the stall of preempting a victim now
(``preemption.choose_mode``); its swap-in later is the resume's cost.

Three rules keep one bad timing from deciding for long, each because a review saw it:

* The guess is the averages' first entry, as a swap the size of the first timed one, so
  the first timing moves the estimate by ``weight`` like any other. Taken whole, the
  first swap-out on CPU (into host pages never touched, 638-949 us a block against 60-144
  warm and a guess of 74) cut the largest victim allowed under 50 ms from 675 blocks to
  62, and eight warm 40-block swaps later it was still 127: its blocks outweighed theirs.
  (The host blocks swaps land in first are now written when the pool is allocated,
  ``kv_cache.py``, so that cold swap is gone until more than a device cacheful is parked
  in host memory at once; these rules are for whatever else makes one swap slow.)
* A swap more than ``SPIKE`` times the estimate counts as ``SPIKE`` times it, unless the
  swap before it was also that far above: one is a spike (a neighbour's burst, a cold
  page), two in a row are the machine, and are believed whole.
* An estimate that judges every victim too large stops its own learning: nothing swaps,
  so nothing is timed. After ``PATIENCE`` swaps refused in a row with none timed between,
  each further refusal counts as that victim swapped at the guess's cost (only while the
  estimate is above the guess), until a victim fits again and its swap is timed. Where
  the copies really are that slow, that costs one over-long swap (two, the first taken
  as a spike) per spell of refusals, in exchange for never being stuck on a stale one.
"""

from __future__ import annotations

import math

# A swap's weight in the averages: about the last 4-8 swaps count, so a one-off stall
# fades within a few.
DEFAULT_WEIGHT = 0.25
# A single swap counts as at most this many times the estimate. A busy machine's copies
# ran 4.5x a quiet one's (16 against 72 ms, benchmarks/swap_copy.py): real, and believed
# on the second swap; a cold pool's first swap ran 6-13x the warm ones.
SPIKE = 4.0
# Swaps refused in a row before the guess re-enters the averages, one refusal at a time.
PATIENCE = 8


class SwapCostError(ValueError):
    """A prior or weight that makes no estimate; the message names the value."""


class SwapCost:
    """Seconds per block of a swap-out: the guess blended with, and soon replaced by, the
    recent timed swap-outs' seconds over their blocks."""

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
        self._last_spiked = False  # the last timed swap was more than SPIKE x the estimate
        self._refused = 0  # swaps refused since the last timed one

    @property
    def measured(self) -> bool:
        """Whether a swap-out has been timed (the estimate is no longer the guess alone)."""
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
        self._refused = 0
        ceiling = SPIKE * self.per_block_s * num_blocks
        spiked = seconds > ceiling
        if spiked and not self._last_spiked:
            seconds = ceiling
        self._last_spiked = spiked
        if self._blocks == 0:
            self._seconds = self.prior_s_per_block * num_blocks
            self._blocks = float(num_blocks)
        self._mix(num_blocks, seconds)

    def observe_refusal(self, num_blocks: int) -> None:
        """``swap_timeout_ms`` turned away the swap of a victim of ``num_blocks``, by this
        estimate: the victim was recomputed (or a newcomer waits) instead."""
        self._refused += 1
        if self._refused > PATIENCE and num_blocks > 0 \
                and self.per_block_s > self.prior_s_per_block:
            self._mix(num_blocks, self.prior_s_per_block * num_blocks)

    def _mix(self, num_blocks: int, seconds: float) -> None:
        w = self.weight
        self._seconds += w * (seconds - self._seconds)
        self._blocks += w * (num_blocks - self._blocks)
