"""The scheduler's state and the few moves every policy shares.

``SchedulerBase`` holds what one scheduler knows (requests, the running list, the
waiting queue, the KV blocks, the iteration being planned) and the moves that change it
in one place: finish a request, preempt a victim, start a request, schedule a row.
The policies build on it: admission (``admission.py``), then the iteration and the
request lifecycle (``scheduler.py``).
"""

from __future__ import annotations

import itertools
from bisect import insort

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.outputs import ScheduledSeq, SchedulerOutput
from slopilot.engine.preemption import choose_mode, swap_refused
from slopilot.engine.request import Request, RequestStatus
from slopilot.engine.swap_cost import SwapCost
from slopilot.engine.waiting_queue import WaitingQueue


def rank(req: Request) -> tuple[int, float, int]:
    """Service order: class, then arrival; the last running request is the next victim."""
    return (req.priority, req.arrival_time, req.seq_no)


class SchedulerBase:
    def __init__(self, config: EngineConfig, num_gpu_blocks: int, num_cpu_blocks: int = 0,
                 swap_s_per_block: float = 0.0, max_model_len: int | None = None) -> None:
        self.config = config
        # The model's context (the executor's); None: unknown, the KV cache alone bounds a
        # request (``context_limit.servable_tokens``).
        self.max_model_len = max_model_len
        self.kv = BlockManager(num_gpu_blocks, config.block_size, num_cpu_blocks,
                               config.enable_prefix_caching)
        # ``swap_s_per_block`` is the executor's guess; its timed swap-outs take over.
        self.swap_cost = SwapCost(swap_s_per_block)
        self.requests: dict[str, Request] = {}
        # Live requests whose sampling has penalties (the executor needs their tokens).
        self._with_penalties: dict[str, Request] = {}
        # Sorted by (priority, arrival): the last element is always the next victim.
        self.running: list[Request] = []
        self._waiting = WaitingQueue()
        # Request id to its unit, for requests admitted together (one HTTP request's
        # choices): a full queue displaces a unit whole or not at all (``queue_room.py``).
        self._units: dict[str, tuple[Request, ...]] = {}
        self._num_swapped = 0
        self._seq = itertools.count()
        self._pending_config: EngineConfig | None = None
        self._finished_ids: list[str] = []
        # Requests schedule() ended without a token; the next update reports them.
        self._ended: list[Request] = []
        # A waiting P0 that has begun preempting its way in, and the blocks it needs:
        # lower classes may not grow into that room, and it need not clear
        # p0_preempt_utilization again, until it is admitted (or can go no further).
        self._p0_claim: Request | None = None
        self._claim_blocks = 0
        # Per-iteration state, reset by schedule().
        self._budget_left = 0
        self._num_decodes = 0  # rows of one token that sample, this iteration
        self._now = 0.0
        self._scheduled: dict[str, ScheduledSeq] = {}
        self._out = SchedulerOutput()
        # Lifetime counters the engine turns into metrics.
        self.num_preemptions = {PreemptionMode.RECOMPUTE: 0, PreemptionMode.SWAP: 0}
        self.prefix_queries = 0
        self.prefix_hits = 0
        # Seconds the executor reported its swap copies (out and in) took.
        self.swap_seconds = 0.0

    @property
    def swap_s_per_block(self) -> float:
        """The swap-out cost of one block that ``swap_timeout_ms`` is judged by."""
        return self.swap_cost.per_block_s

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        self.kv.free(req.request_id)
        del self.requests[req.request_id]
        self._with_penalties.pop(req.request_id, None)
        self._units.pop(req.request_id, None)
        self._finished_ids.append(req.request_id)

    def _cap_reached(self, newcomer: bool) -> bool:
        # The per-step cap yields only while something else in this step progresses;
        # otherwise a full cache of half-done prefills could never move again.
        out = self._out
        return out.num_preempted_recompute + out.num_preempted_swap \
            >= self.config.max_preemptions_per_step and (bool(self._scheduled) or newcomer)

    def _preempt(self, victim: Request, newcomer: bool = False, *, capped: bool = True
                 ) -> bool:
        """Preempt ``victim`` (the lowest-ranked running request); False if not allowed.

        ``capped=False`` ignores ``max_preemptions_per_step`` (``_trim_running`` only)."""
        out, cfg = self._out, self.config
        if capped and self._cap_reached(newcomer):
            return False
        mode = choose_mode(cfg, self.kv, victim, self.swap_s_per_block, newcomer=newcomer)
        if mode is not PreemptionMode.SWAP \
                and swap_refused(cfg, self.kv, victim, self.swap_s_per_block):
            # Not the hypothetical checks (admission's ``_p0_can_make_room``): only a
            # victim really turned away, lest one waiting P0 count as a refusal a step.
            self.swap_cost.observe_refusal(self.kv.num_blocks(victim.request_id))
        if mode is None:
            return False
        self.running.remove(victim)
        rid = victim.request_id
        undone = self._scheduled.pop(rid, None)
        out.prompt_logprob_targets.pop(rid, None)
        if undone is not None:
            self._budget_left += len(undone.token_ids)
            if undone.sample and len(undone.token_ids) == 1:
                self._num_decodes -= 1
            victim.num_computed_tokens = undone.start_pos
        if mode is PreemptionMode.SWAP:
            out.swap_out.extend(self.kv.swap_out(rid))
            victim.status = RequestStatus.PREEMPTED_SWAPPED
            self._num_swapped += 1
            out.num_preempted_swap += 1
        else:
            self.kv.free(rid, keep_chain=True)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.PREEMPTED_RECOMPUTE
            out.num_preempted_recompute += 1
        self.num_preemptions[mode] += 1
        victim.num_preemptions += 1
        self._waiting.push(victim)
        return True

    def _trim_running(self, limit: int) -> None:
        """Preempt running requests past ``limit`` (what one budget can decode), lowest
        class and newest first, recompute or swap as for any victim.

        Only a live cut of the budget leaves more running than it can decode (admission
        stops at ``effective_max_num_seqs``). Skipped decodes would be the same tail
        every step (``running`` is in rank order): hundreds of iterations without a token,
        with nothing preempted and no stall reported. So the whole excess goes at once,
        past ``max_preemptions_per_step``, which bounds thrash under KV pressure, not
        the one-off consequence of a new config; the counts and metrics include them.
        A running victim never waits on a slow swap: it is recomputed instead."""
        running = self.running
        while len(running) > limit and self._preempt(running[-1], capped=False):
            pass

    def _start_running(self, req: Request) -> None:
        if req.first_scheduled_time is None:
            req.first_scheduled_time = self._now
        req.status = RequestStatus.RUNNING
        insort(self.running, req, key=rank)

    def _schedule_seq(self, req: Request, n: int) -> None:
        start = req.num_computed_tokens
        end = start + n
        if n == 1:
            tokens = [req.token_at(start)]
        else:
            tokens = req.token_slice(start, end)
        rid = req.request_id
        if req.sampling.prompt_logprobs is not None and start < req.num_prompt_tokens - 1:
            self._out.prompt_logprob_targets[rid] = \
                req.prompt_token_ids[start + 1:min(end + 1, req.num_prompt_tokens)]
        sample = end == req.num_tokens
        self._scheduled[rid] = ScheduledSeq(
            rid, tokens, start, self.kv.block_table(rid), sample, req.sampling,
            len(req.output_token_ids))
        if sample and n == 1:
            self._num_decodes += 1
        req.num_computed_tokens = end
        self._budget_left -= n
