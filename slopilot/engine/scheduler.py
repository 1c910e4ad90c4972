"""Stall-free (Sarathi-style) continuous-batching scheduler with priority classes.

One iteration, under a token budget:
  1. every running decode gets one token (no decode stalls behind a prefill);
  2. partially prefilled requests get their next chunk, capped by ``chunk_size``;
  3. waiting requests are admitted by class, then arrival, each with a first chunk.
When KV blocks run out for a running request, the lowest-class, newest running request
is preempted (recompute or swap); a waiting P0 may preempt P1/P2 under KV pressure.

``schedule()`` returns plain data for the executor; ``update_from_output()`` applies
the sampled tokens. Nothing here knows about torch, HTTP or wall-clock time.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import insort

from slopilot.engine.block_manager import BlockManager
from slopilot.engine.config import ConfigError, EngineConfig, PreemptionMode
from slopilot.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from slopilot.engine.preemption import choose_mode
from slopilot.engine.request import Priority, Request, RequestStatus


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting``; the server answers 429."""


class PromptTooLongError(ValueError):
    """The prompt can never fit in the KV cache; the server answers 413."""


def _rank(req: Request) -> tuple[int, int]:
    return (req.priority, req.seq_no)


class Scheduler:
    def __init__(self, config: EngineConfig, num_gpu_blocks: int, num_cpu_blocks: int = 0,
                 swap_s_per_block: float = 0.0) -> None:
        self.config = config
        self.kv = BlockManager(num_gpu_blocks, config.block_size, num_cpu_blocks,
                               config.enable_prefix_caching)
        self.swap_s_per_block = swap_s_per_block
        self.requests: dict[str, Request] = {}
        # Sorted by (priority, arrival): the last element is always the next victim.
        self.running: list[Request] = []
        self._waiting: list[tuple[int, int, Request]] = []
        self._num_waiting = 0
        self._num_swapped = 0
        self._seq = itertools.count()
        self._pending_config: EngineConfig | None = None
        self._finished_ids: list[str] = []
        # Requests the last schedule() ended without a token (out of KV capacity); the
        # engine loop reports them, as it reports those that finish on a token.
        self.finished_in_schedule: list[Request] = []
        # Per-iteration state, reset by schedule().
        self._budget_left = 0
        self._now = 0.0
        self._scheduled: dict[str, ScheduledSeq] = {}
        self._out = SchedulerOutput()
        # Lifetime counters the engine turns into metrics.
        self.num_preemptions = {PreemptionMode.RECOMPUTE: 0, PreemptionMode.SWAP: 0}
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ------------------------------------------------------------------ requests
    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_swapped(self) -> int:
        return self._num_swapped

    def has_work(self) -> bool:
        return bool(self.running) or self._num_waiting > 0

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        if self._num_waiting >= self.config.max_waiting:
            raise QueueFullError(
                f"{self._num_waiting} requests are waiting (max_waiting="
                f"{self.config.max_waiting}); retry later")
        capacity = self.kv.num_gpu_blocks * self.kv.block_size
        if req.num_tokens + 1 > capacity:
            raise PromptTooLongError(
                f"prompt of {req.num_tokens} tokens cannot fit in the KV cache "
                f"({capacity} tokens); shorten the prompt")
        req.seq_no = next(self._seq)
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        heapq.heappush(self._waiting, (req.priority, req.seq_no, req))
        self._num_waiting += 1

    def abort_request(self, request_id: str,
                      status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> Request | None:
        """Finish a request from outside (client gone, or a stop string matched in its
        text: ``FINISHED_STOPPED``) and free its blocks; None if it is unknown."""
        if not status.is_finished:
            raise ValueError(f"status={status.name}: a request can only be ended with a "
                             "FINISHED_* status")
        req = self.requests.get(request_id)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            # Left in the heap and skipped when it reaches the top.
            self._num_waiting -= 1
            if req.status is RequestStatus.PREEMPTED_SWAPPED:
                self._num_swapped -= 1
        self._finish(req, status)
        return req

    def update_config(self, config: EngineConfig) -> None:
        """Stage a new config; it takes effect at the start of the next iteration.

        With no request in the engine there is no iteration to wait for: it takes effect
        at once, so what the engine reports (its config gauges) is what it will run.
        """
        if config.block_size != self.config.block_size:
            raise ConfigError("block_size cannot change on a running engine; restart it",
                              "block_size")
        if self.requests:
            self._pending_config = config
        else:
            self.config, self._pending_config = config, None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        self.kv.free(req.request_id)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        """Plan one iteration; ``now`` stamps first scheduling (queue time)."""
        self._now = now
        if self._pending_config is not None:
            self.config, self._pending_config = self._pending_config, None
        cfg = self.config
        self.kv.begin_step()
        self._out = out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        self.finished_in_schedule = []
        self._scheduled = {}
        self._budget_left = cfg.effective_budget

        self._schedule_running()
        # A step that had to preempt for growth admits nobody: the KV is already short.
        if not (out.num_preempted_recompute or out.num_preempted_swap):
            self._admit_waiting()

        out.seqs = seqs = list(self._scheduled.values())
        total = prefill = 0
        for s in seqs:
            n = len(s.token_ids)
            total += n
            if n > 1 or not s.sample:
                prefill += n
        out.num_batched_tokens = total
        out.num_prefill_tokens = prefill
        out.num_decode_tokens = total - prefill
        return out

    def _schedule_running(self) -> None:
        """Decodes first (one token each), then partial prefills (a chunk each)."""
        running = self.running
        tables = self.kv.tables
        bs = self.kv.block_size
        scheduled = self._scheduled
        prefills: list[Request] = []
        i = 0
        while i < len(running) and self._budget_left > 0:
            req = running[i]
            computed = req.num_computed_tokens
            if req.num_tokens - computed != 1:
                prefills.append(req)
                i += 1
                continue
            rid = req.request_id
            table = tables[rid]
            if computed < len(table) * bs:
                # Hot path: the last block has room, so no allocation and no preemption.
                out = req.output_token_ids
                last = out[-1] if out else req.prompt_token_ids[-1]
                scheduled[rid] = ScheduledSeq(rid, [last], computed, table, True,
                                              req.sampling, len(out))
                req.num_computed_tokens = computed + 1
                self._budget_left -= 1
                i += 1
                continue
            self._grow(req, 1)
            if i < len(running) and running[i] is req:
                i += 1  # else it was preempted or finished, and running[i] is the next
        chunk = self.config.chunk_size
        for req in prefills:
            if self._budget_left <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted by an earlier request's growth
            n = min(req.num_tokens - req.num_computed_tokens, chunk, self._budget_left)
            self._grow(req, n)

    def _grow(self, req: Request, n: int) -> bool:
        """Schedule ``n`` more tokens of a running request; False if it got no room."""
        if req.num_computed_tokens + n > self.kv.num_gpu_blocks * self.kv.block_size:
            # It can never grow further on this cache, even alone.
            self.running.remove(req)
            self._finish(req, RequestStatus.FINISHED_LENGTH)
            self.finished_in_schedule.append(req)
            return False
        if self._reserve(req, n):
            self._schedule_seq(req, n)
            return True
        if req.status is RequestStatus.RUNNING:
            self._out.num_stalled += 1
        return False

    def _reserve(self, req: Request, n: int) -> bool:
        """Get KV room for ``n`` more tokens of a running request, preempting if needed."""
        kv = self.kv
        while not kv.allocate_slots(req, n):
            if not self._preempt(self.running[-1]):
                return False
            if req.status is not RequestStatus.RUNNING:
                return False
        return True

    def _preempt(self, victim: Request, newcomer: bool = False) -> bool:
        """Preempt ``victim`` (the lowest-ranked running request); False if not allowed."""
        out, cfg = self._out, self.config
        # The per-step cap yields only while something else in this step progresses;
        # otherwise a full cache of half-done prefills could never move again.
        if out.num_preempted_recompute + out.num_preempted_swap \
                >= cfg.max_preemptions_per_step and (self._scheduled or newcomer):
            return False
        mode = choose_mode(cfg, self.kv, victim, self.swap_s_per_block, newcomer=newcomer)
        if mode is None:
            return False
        self.running.remove(victim)
        rid = victim.request_id
        undone = self._scheduled.pop(rid, None)
        if undone is not None:
            self._budget_left += len(undone.token_ids)
            victim.num_computed_tokens = undone.start_pos
        if mode is PreemptionMode.SWAP:
            out.swap_out.extend(self.kv.swap_out(rid))
            victim.status = RequestStatus.PREEMPTED_SWAPPED
            self._num_swapped += 1
            out.num_preempted_swap += 1
        else:
            self.kv.free(rid)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.PREEMPTED_RECOMPUTE
            out.num_preempted_recompute += 1
        self.num_preemptions[mode] += 1
        victim.num_preemptions += 1
        heapq.heappush(self._waiting, (victim.priority, victim.seq_no, victim))
        self._num_waiting += 1
        return True

    def _admit_waiting(self) -> None:
        cfg, kv, waiting = self.config, self.kv, self._waiting
        # The watermark guards running requests against thrash; with none running it
        # would only keep a large prompt out forever.
        reserve = int(cfg.kv_watermark * kv.num_gpu_blocks) if self.running else 0
        while waiting and self._budget_left > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting[0][2]
            if req.status.is_finished:
                heapq.heappop(waiting)
                continue
            while not self._try_admit(req, reserve):
                # Strict priority: nobody jumps the head of the queue, except that a
                # P0 head may push out P1/P2 work while the cache is under pressure.
                if not (req.priority is Priority.P0 and self.running
                        and self.running[-1].priority > Priority.P0
                        and kv.usage > cfg.p0_preempt_utilization
                        and self._preempt(self.running[-1], newcomer=True)):
                    return
            heapq.heappop(waiting)
            self._num_waiting -= 1

    def _try_admit(self, req: Request, reserve: int) -> bool:
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
        cached = kv.find_cached_prefix(req)
        num_cached = len(cached) * kv.block_size
        n = min(req.num_tokens - num_cached, self.config.chunk_size, self._budget_left)
        if not kv.allocate_slots(req, n, cached, reserve):
            return False
        self.prefix_queries += req.num_tokens
        self.prefix_hits += num_cached
        req.num_computed_tokens = req.num_cached_tokens = num_cached
        self._start_running(req)
        self._schedule_seq(req, n)
        return True

    def _start_running(self, req: Request) -> None:
        if req.first_scheduled_time is None:
            req.first_scheduled_time = self._now
        req.status = RequestStatus.RUNNING
        insort(self.running, req, key=_rank)

    def _schedule_seq(self, req: Request, n: int) -> None:
        start = req.num_computed_tokens
        end = start + n
        if n == 1:
            tokens = [req.token_at(start)]
        else:
            tokens = req.token_slice(start, end)
        self._scheduled[req.request_id] = ScheduledSeq(
            req.request_id, tokens, start, self.kv.block_table(req.request_id),
            end == req.num_tokens, req.sampling, len(req.output_token_ids))
        req.num_computed_tokens = end
        self._budget_left -= n

    # ------------------------------------------------------------------ update
    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput
                           ) -> list[Request]:
        """Apply sampled tokens; returns the requests that got a token this iteration."""
        sampled = result.sampled
        requests = self.requests
        kv = self.kv
        bs = kv.block_size
        caching = self.config.enable_prefix_caching
        running = RequestStatus.RUNNING
        got: list[Request] = []
        any_finished = False
        for seq in out.seqs:
            req = requests.get(seq.request_id)
            if req is None or req.status is not running:
                continue  # aborted or preempted while the batch ran
            if caching and req.num_computed_tokens // bs > seq.start_pos // bs:
                kv.cache_full_blocks(req)
            if not seq.sample:
                continue
            token = sampled[seq.request_id]
            req.append_output(token)
            got.append(req)
            params = req.sampling
            # Fast path: below max_tokens with nothing that could stop it.
            if len(req.output_token_ids) < params.max_tokens and params.ignore_eos \
                    and not params.stop_token_ids:
                continue
            status = req.check_stop(token)
            if status is not None:
                self._finish(req, status)
                any_finished = True
        if any_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return got

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        for req in self.running:
            if self.kv.num_blocks(req.request_id) * self.kv.block_size < \
                    req.num_computed_tokens:
                raise AssertionError(f"{req.request_id} has fewer blocks than tokens")
