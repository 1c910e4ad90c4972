"""Admission: waiting requests start by class, then arrival, while room allows.

Strict priority: nobody jumps the head of the queue, except that a P0 head may push out
P1/P2 work for one of two shortages:

- KV blocks, while the cache is under pressure (usage above p0_preempt_utilization);
- a seq slot, when every slot is taken (``effective_max_num_seqs``), whatever the KV
  usage: a full slot table is its own shortage, and without this a P0 waited for a P2
  batch job to finish. It takes one slot: one victim, even when a live cut of
  max_num_seqs left more running than the new value (they drain as they finish).

Such a P0 first checks that preempting lower classes could ever let it in (else nobody's
work is thrown away for nothing), then preempts the newest of them until it fits. When
the per-step preemption cap stops it short, it keeps a *claim*: next step, lower classes
may not grow into the room it freed, and it goes on without judging the threshold
again, so the victims already taken are not wasted.

The scheduler calls admission once per class, after that class's partial prefills and
before any lower class's (strict priority for the budget as well).
"""

from __future__ import annotations

from slopilot.engine.preemption import choose_mode
from slopilot.engine.request import Priority, Request, RequestStatus
from slopilot.engine.scheduler_base import SchedulerBase


def _may_read_cache(req: Request) -> bool:
    # Prompt logprobs come from the prompt's own logits: positions served from the
    # cache would have none, so such a request computes its prompt in full (as in vLLM).
    return req.sampling.prompt_logprobs is None \
        or len(req.prompt_logprobs) >= req.num_prompt_tokens - 1


class Admission(SchedulerBase):
    def _watermark_blocks(self) -> int:
        # The watermark guards running requests against thrash; with none running it
        # would only keep a large prompt out forever.
        return int(self.config.kv_watermark * self.kv.num_gpu_blocks) if self.running else 0

    def _admit_waiting(self, cls: Priority, only_claim: bool = False) -> None:
        """Admit waiting requests of class ``cls`` while they head the queue."""
        cfg, kv, waiting = self.config, self.kv, self._waiting
        reserve = self._watermark_blocks()
        max_seqs = cfg.effective_max_num_seqs
        while waiting and self._budget_left > 0:
            req = waiting.peek()
            if req.priority != cls:
                return  # a higher class's head still waits (strict), or cls is done
            claiming = req is self._p0_claim
            if only_claim and not claiming:
                return
            slot_free = len(self.running) < max_seqs
            if not slot_free and cls is not Priority.P0:
                return
            # Strict priority: nobody jumps the head of the queue, except that a P0 head
            # may push out P1/P2 work for a slot, or for blocks while the cache is under
            # pressure. The threshold is read once, before any victim is chosen: each
            # victim lowers the usage, and re-reading it between victims would stop short
            # with the victims wasted.
            kv_pressure = claiming or (cls is Priority.P0
                                       and kv.usage > cfg.p0_preempt_utilization)
            may_preempt = claiming or (cls is Priority.P0 and (
                kv_pressure or not slot_free) and self._p0_can_make_room(
                    req, reserve, slot_free, kv_pressure))
            while not (slot_free and self._try_admit(req, reserve)):
                # Short of a slot: the first victim gives one. Short of blocks once it has
                # a slot: only KV pressure (or a claim) lets it take more.
                if not may_preempt or (slot_free and not kv_pressure) \
                        or not self._preempt_for(req):
                    return
                slot_free = True
            waiting.pop()
            if claiming:
                # Admitted: the room it claimed is its own now, and lower classes later
                # in this step may grow into what is left.
                self._p0_claim = None
                self._claim_blocks = 0
            if self._out.num_preempted_recompute or self._out.num_preempted_swap:
                # A step that preempted admits nobody after the P0 it preempted for:
                # the victims would only come straight back (as in vLLM).
                return

    def _p0_blocks_to_admit(self, req: Request) -> int:
        """Free blocks a waiting P0 needs to start (its first chunk, or its swap-in)."""
        kv = self.kv
        if req.status is RequestStatus.PREEMPTED_SWAPPED:
            return kv.num_swapped_blocks(req.request_id)
        cached = kv.find_cached_prefix(req) if _may_read_cache(req) else []
        n = min(req.num_tokens - len(cached) * kv.block_size, self.config.chunk_size,
                self._budget_left)
        return kv.free_blocks_needed(req, n, cached)

    def _p0_can_make_room(self, req: Request, reserve: int, slot_free: bool,
                          kv_pressure: bool) -> bool:
        """Whether preempting lower classes (newest first) would ever let ``req`` in: if
        not, preempting anyone only wastes their work. Without KV pressure only a slot
        may be taken (one victim), so its blocks and the free ones must do."""
        kv, cfg = self.kv, self.config
        need = self._p0_blocks_to_admit(req) + reserve
        room = kv.num_free_blocks
        for victim in reversed(self.running):
            if room >= need and slot_free:
                return True
            if (slot_free and not kv_pressure) or victim.priority <= req.priority \
                    or choose_mode(cfg, kv, victim, self.swap_s_per_block,
                                   newcomer=True) is None:
                break
            room += kv.num_exclusive_blocks(victim.request_id)
            slot_free = True
        return room >= need and slot_free

    def _preempt_for(self, req: Request) -> bool:
        """Preempt the next victim for a waiting P0; on the per-step cap, keep a claim
        on the room freed so far, so that the next step finishes the job."""
        victim = self.running[-1] if self.running else None
        if victim is None or victim.priority <= req.priority:
            self._p0_claim = None  # no lower-class victim left to take room from
            return False
        if self._preempt(victim, newcomer=True):
            self._p0_claim = req
            return True
        # Past the per-step cap the claim stands; past a victim whose swap would take
        # too long there is no way in, and the P0 waits like any head of the queue.
        self._p0_claim = req if self._cap_reached(True) else None
        return False

    def _claimed_blocks(self) -> int:
        claim = self._p0_claim
        if claim is None:
            return 0
        if claim.status.is_finished or claim.status is RequestStatus.RUNNING:
            self._p0_claim = None
            return 0
        return self._p0_blocks_to_admit(claim) + self._watermark_blocks()

    def _try_admit(self, req: Request, reserve: int) -> bool:
        """Start ``req`` with its first chunk (or swap it back in); False if KV is short."""
        kv = self.kv
        rid = req.request_id
        if req.status is RequestStatus.PREEMPTED_SWAPPED:
            pairs = kv.swap_in(rid, reserve)
            if pairs is None:
                return False
            self._out.swap_in.extend(pairs)
            self._num_swapped -= 1
            self._start_running(req)
            n = min(req.num_tokens - req.num_computed_tokens, self.config.chunk_size,
                    self._budget_left)
            # Room for the next token usually exists (a swapped-in decode only needs a
            # block at a boundary); if not, it runs from the next iteration.
            if kv.allocate_slots(req, n):
                self._schedule_seq(req, n)
            return True
        looked = kv.enable_prefix_caching and _may_read_cache(req)
        cached = kv.find_cached_prefix(req) if looked else []
        num_cached = len(cached) * kv.block_size
        n = min(req.num_tokens - num_cached, self.config.chunk_size, self._budget_left)
        if not kv.allocate_slots(req, n, cached, reserve):
            return False
        # As vLLM counts them (kv_cache_manager.record_prefix_cache_stats): at admission,
        # a request that looked the cache up, and not once more after a preemption (vLLM
        # keeps those apart, unexported): a victim re-hitting the blocks it computed
        # itself is thrash, not a cache that works.
        if looked and not req.num_preemptions:
            self.prefix_queries += req.num_tokens
            self.prefix_hits += num_cached
        req.num_computed_tokens = req.num_cached_tokens = num_cached
        self._start_running(req)
        self._schedule_seq(req, n)
        return True

