"""Stall-free (Sarathi-style) continuous-batching scheduler with priority classes.

One iteration, under a token budget:
  0. no more requests run than the budget can decode (a live cut preempts the excess);
  1. every running decode gets one token (no decode stalls behind a prefill);
  2-3. the rest of the budget goes to prefill work class by class: a class's partially
     prefilled requests (their next chunk, capped by ``chunk_size``), then its waiting
     requests (by arrival, each with a first chunk), before any lower class's.
When KV blocks run out for a running request, the lowest-class, newest running request
is preempted (recompute or swap); a waiting P0 may preempt P1/P2 under KV pressure.

``schedule()`` returns plain data for the executor; ``update_from_output()`` applies
the sampled tokens. Nothing here knows about torch, HTTP or wall-clock time.
Admission (step 3) is ``admission.py``; the state and the shared moves (finish,
preempt, schedule a row) are ``scheduler_base.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from slopilot.engine.admission import Admission
from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.context_limit import fits_context, servable_tokens
from slopilot.engine.kv_integrity import IntegrityError, check_block_manager
from slopilot.engine.outputs import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from slopilot.engine.queue_room import DisplacedError, QueueFullError, room_for
from slopilot.engine.request import Priority, Request, RequestStatus

__all__ = ["DisplacedError", "DuplicateRequestError", "PromptTooLongError", "QueueFullError",
           "Scheduler", "StepOutput"]


class PromptTooLongError(ValueError):
    """The prompt can never fit in the KV cache; the server answers 400."""


class DuplicateRequestError(ValueError):
    """A request id the engine already holds, or a request object already submitted."""


@dataclass(slots=True)
class StepOutput:
    """What one iteration did to requests (``update_from_output``'s answer).

    ``new_tokens``: requests that got a token, in batch order (some of them finished).
    ``finished``: every request that ended in this iteration, with a token or without
    one (the scheduler ends a request that can never grow on this cache).
    """

    new_tokens: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)


def _record_logprobs(requests: dict[str, Request], out: SchedulerOutput,
                     result: ModelRunnerOutput) -> None:
    """Logprobs onto their requests (before the tokens: a request may finish on its)."""
    for seq in out.seqs:
        req = requests.get(seq.request_id)
        if req is None or req.status is not RequestStatus.RUNNING:
            continue
        lp = result.logprobs.get(seq.request_id)
        if lp is not None:
            req.output_logprobs.append(lp)
        prompt = result.prompt_logprobs.get(seq.request_id)
        if prompt:
            # Entry j predicts prompt token start_pos + 1 + j; a recomputed prefill
            # (after a preemption) predicts again what is recorded: only the rest counts.
            skip = len(req.prompt_logprobs) - seq.start_pos
            if skip >= 0:
                req.prompt_logprobs.extend(prompt[skip:])


class Scheduler(Admission):
    # ------------------------------------------------------------------ requests
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_swapped(self) -> int:
        return self._num_swapped

    def has_work(self) -> bool:
        return bool(self.running) or bool(self._waiting)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a prompt of ``num_tokens`` (and its first output token) fits the whole
        KV cache: ``add_request``'s rule for the cache, beside the model's context (the
        simulator judges a trace's lengths by ``can_ever_finish``, the server's rule)."""
        return num_tokens + 1 <= self.kv.num_gpu_blocks * self.kv.block_size

    @property
    def servable_len(self) -> int:
        """The most prompt plus output tokens one request may reach: the model's context,
        at most what the whole KV cache holds (``context_limit.servable_tokens``, the rule
        the server advertises and enforces)."""
        return servable_tokens(self.max_model_len,
                               self.kv.num_gpu_blocks * self.kv.block_size)

    def can_ever_finish(self, num_prompt_tokens: int, max_tokens: int) -> bool:
        """Whether the server takes a request of ``num_prompt_tokens`` and ``max_tokens``
        of output: it refuses one past the model's context, or past the whole KV cache
        (no request grows past it, even alone), with a 400 ``context_length_exceeded``
        (``backends.servable_len``); the simulator rejects it as the server does."""
        return fits_context(num_prompt_tokens, max_tokens, self.servable_len)

    def add_request(self, req: Request) -> list[Request]:
        """Queue ``req``; the requests displaced to make room for it (``add_requests``)."""
        return self.add_requests((req,))

    def add_requests(self, reqs: Sequence[Request]) -> list[Request]:
        """Queue ``reqs`` all or none, as one unit (one HTTP request's choices).

        Returns the requests displaced from a full queue to make room for them, finished
        here (``queue_room.py``): each is its client's refusal for load, for the caller
        to answer and count as a refusal of its class; none finishes through the engine.
        Raises PromptTooLongError, DuplicateRequestError, or QueueFullError where no less
        urgent request could give way; then nothing changed.
        """
        ids = [r.request_id for r in reqs]
        if len(set(ids)) != len(ids):
            raise DuplicateRequestError(f"request ids {ids} repeat one; give each request "
                                        "a unique id")
        for req in reqs:
            self._check_new(req)
        displaced = room_for(reqs, self._waiting, self._units, self.config.max_waiting)
        for victim in displaced:
            self._waiting.remove(victim)
            self._finish(victim, RequestStatus.FINISHED_ABORTED)
        for req in reqs:
            req.seq_no = next(self._seq)
            self.requests[req.request_id] = req
            if req.sampling.has_penalties:
                self._with_penalties[req.request_id] = req
            self._waiting.push(req)
        if len(reqs) > 1:
            unit = tuple(reqs)
            for req in reqs:
                self._units[req.request_id] = unit
        return displaced

    def _check_new(self, req: Request) -> None:
        """Refuse a request the engine can never take (whatever the load), and cap its
        output at the model's context."""
        if req.request_id in self.requests:
            raise DuplicateRequestError(
                f"request id {req.request_id!r} is already in use; give each request a "
                "unique id")
        if req.status is not RequestStatus.WAITING or req.output_token_ids \
                or req.num_computed_tokens:
            raise DuplicateRequestError(
                f"request {req.request_id!r} was already submitted once (status "
                f"{req.status.name}); build a new Request to run it again")
        # A prompt that can never fit first: the client's error whatever the load (a 400,
        # not a 429 inviting a retry that fails again, nor counted as a client turned away).
        if not self.can_ever_fit(req.num_tokens):
            raise PromptTooLongError(
                f"prompt of {req.num_tokens} tokens cannot fit in the KV cache "
                f"({self.kv.num_gpu_blocks * self.kv.block_size} tokens); shorten the prompt")
        limit = self.max_model_len
        if limit is not None and req.num_tokens >= limit:
            raise PromptTooLongError(
                f"prompt of {req.num_tokens} tokens leaves no room for an output token in "
                f"the model's context of {limit} tokens; shorten the prompt")
        if limit is not None and req.num_tokens + req.sampling.max_tokens > limit:
            # A caller past the server (which refuses this with a 400): capped as vLLM's
            # engine caps a request at max_model_len, so the model never runs at a
            # position it does not have. Here, once, not on every decode's hot path. (The
            # KV cache's own bound is _grow's: it ends a request that outgrows it.)
            room = limit - req.num_tokens
            req.sampling = replace(
                req.sampling, max_tokens=room, min_tokens=min(req.sampling.min_tokens, room))

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
            self._waiting.remove(req)
            if req.status is RequestStatus.PREEMPTED_SWAPPED:
                self._num_swapped -= 1
        if req is self._p0_claim:
            self._p0_claim = None
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
            self._apply_config(config)

    def _apply_config(self, config: EngineConfig) -> None:
        self.config, self._pending_config = config, None
        # Every live knob is live in full: the block manager switches with the config.
        self.kv.set_prefix_caching(config.enable_prefix_caching)

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float = 0.0) -> SchedulerOutput:
        """Plan one iteration; ``now`` stamps first scheduling (queue time)."""
        self._now = now
        if self._pending_config is not None:
            self._apply_config(self._pending_config)
        self.kv.begin_step()
        self._out = out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        self._scheduled = {}
        self._budget_left = budget = self.config.effective_budget
        self._num_decodes = 0
        self._claim_blocks = self._claimed_blocks() if self._p0_claim is not None else 0

        if len(self.running) > budget:
            # A live cut of the budget: preempt what it cannot decode, never skip it.
            self._trim_running(budget)
        self._schedule_prefills(self._schedule_decodes())

        out.seqs = list(self._scheduled.values())
        if self._with_penalties:
            scheduled = self._scheduled
            out.histories = {rid: (r.prompt_token_ids, r.output_token_ids)
                             for rid, r in self._with_penalties.items() if rid in scheduled}
        # Every scheduled token came out of the budget (and an undone row went back).
        out.num_batched_tokens = total = budget - self._budget_left
        out.num_decode_tokens = self._num_decodes
        out.num_prefill_tokens = total - self._num_decodes
        return out

    def _schedule_decodes(self) -> list[Request]:
        """Step 1: every running decode gets its token; returns the partial prefills (in
        rank order, so grouped by class) for the budget that is left."""
        running = self.running
        tables = self.kv.tables
        bs = self.kv.block_size
        scheduled = self._scheduled
        prefills: list[Request] = []
        # Locals, not attributes, on the hot path; synced around _grow, which reads
        # the budget and may shrink the running list.
        budget, num_running = self._budget_left, len(running)
        decodes = 0
        i = 0
        while i < num_running and budget > 0:
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
                budget -= 1
                decodes += 1
                i += 1
                continue
            self._budget_left = budget
            self._grow(req, 1)
            budget, num_running = self._budget_left, len(running)
            if i < num_running and running[i] is req:
                i += 1  # else it was preempted or finished, and running[i] is the next
        self._budget_left = budget
        self._num_decodes += decodes
        return prefills

    def _schedule_prefills(self, partials: list[Request]) -> None:
        """Steps 2-3 by class: strict priority holds for the budget as for admission.

        A class's partial prefills, then its waiting requests, before any lower class's:
        with partial prefills of every class first, a P0 waited for whole P2 prompts
        already running (31 iterations behind two of 16,000 tokens). Within a class the
        partial prefills go first, so a class's started work finishes before it takes on
        more.
        """
        chunk = self.config.chunk_size
        i, num_partials = 0, len(partials)
        for cls in Priority:
            while i < num_partials and partials[i].priority == cls:
                req = partials[i]
                i += 1
                if self._budget_left <= 0:
                    return
                if req.status is not RequestStatus.RUNNING:
                    continue  # preempted by an earlier request's growth
                n = min(req.num_tokens - req.num_computed_tokens, chunk, self._budget_left)
                self._grow(req, n)
            if self._budget_left <= 0:
                return
            waiting = self._waiting
            if not waiting or waiting.peek().priority != cls:
                continue  # nobody of this class heads the queue
            out = self._out
            # A step that had to preempt admits nobody (the KV is already short, and the
            # victims would only come straight back), except a P0 whose claim that
            # growth had to respect.
            if not (out.num_preempted_recompute or out.num_preempted_swap):
                self._admit_waiting(cls)
            elif self._p0_claim is not None and cls is Priority.P0:
                self._admit_waiting(cls, only_claim=True)

    def _grow(self, req: Request, n: int) -> bool:
        """Schedule ``n`` more tokens of a running request; False if it got no room."""
        if req.num_computed_tokens + n > self.kv.num_gpu_blocks * self.kv.block_size:
            # It can never grow further on this cache, even alone.
            self.running.remove(req)
            self._finish(req, RequestStatus.FINISHED_LENGTH)
            self._ended.append(req)
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
        # Room a claiming P0 has freed is not for lower classes to grow into.
        held = self._claim_blocks if req.priority > Priority.P0 else 0
        while not kv.allocate_slots(req, n, reserve_blocks=held):
            if not self._preempt(self.running[-1]):
                return False
            if req.status is not RequestStatus.RUNNING:
                return False
        return True

    # ------------------------------------------------------------------ update
    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput
                           ) -> StepOutput:
        """Apply sampled tokens; returns who got a token and who finished this iteration
        (including those ``schedule()`` had to end without one)."""
        sampled = result.sampled
        requests = self.requests
        kv = self.kv
        bs = kv.block_size
        caching = kv.enable_prefix_caching
        running = RequestStatus.RUNNING
        step = StepOutput(finished=self._ended)
        self._ended = []
        got, finished = step.new_tokens, step.finished
        num_finished = len(finished)
        if result.logprobs or result.prompt_logprobs:
            _record_logprobs(requests, out, result)
        if out.swap_out or out.swap_in:
            self._record_swaps(out, result)
        get, add_got = requests.get, got.append
        prefilled = 0
        for seq in out.seqs:
            rid = seq.request_id
            req = get(rid)
            if req is None or req.status is not running:
                continue  # aborted or preempted while the batch ran
            computed = req.num_computed_tokens
            # The row filled a block iff it ran past the start of the last one.
            if caching and computed - seq.start_pos > computed % bs:
                kv.cache_full_blocks(req)
            if not seq.sample:
                continue
            token = sampled[rid]
            # req.append_output(token), inlined: this loop runs for every decode.
            outputs = req.output_token_ids
            outputs.append(token)
            req.num_tokens += 1
            add_got(req)
            if not seq.num_output_tokens:
                prefilled += req.num_prompt_tokens - req.num_cached_tokens
            params = req.sampling
            # Fast path: below max_tokens with nothing that could stop it.
            if len(outputs) < params.max_tokens and params.ignore_eos \
                    and not params.stop_token_ids:
                continue
            status = req.check_stop(token)
            if status is not None:
                self._finish(req, status)
                finished.append(req)
        if len(finished) > num_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        out.vllm_iteration_tokens = len(got) + prefilled
        return step

    def _record_swaps(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """The executor's timing of this iteration's copies: exported, and the next
        victim's swap judged by the swap-outs' (``swap_cost.py``)."""
        if result.swap_out_s is not None:
            self.swap_seconds += result.swap_out_s
            self.swap_cost.observe_swap_out(len(out.swap_out), result.swap_out_s)
        if result.swap_in_s is not None:
            self.swap_seconds += result.swap_in_s

    def check_integrity(self) -> None:
        """The block manager's invariants, and every live request in exactly one place.

        O(blocks + requests): tests and the debug flag only, never the serving path.
        """
        check_block_manager(self.kv)
        bs = self.kv.block_size
        for req in self.running:
            if req.status is not RequestStatus.RUNNING:
                raise AssertionError(f"{req.request_id} is running as {req.status.name}")
            if self.kv.num_blocks(req.request_id) * bs < req.num_computed_tokens:
                raise AssertionError(f"{req.request_id} has fewer blocks than tokens")
        waiting = list(self._waiting)
        if any(r.status >= RequestStatus.RUNNING for r in waiting):
            raise AssertionError("a running or finished request is in the waiting queue")
        ids = [r.request_id for r in self.running] + [r.request_id for r in waiting]
        if len(ids) != len(set(ids)) or set(ids) != set(self.requests):
            raise AssertionError("running + waiting disagree with the live requests")
        preempted = sum(r.status is not RequestStatus.WAITING for r in waiting)
        if preempted != self._waiting.num_preempted:
            raise AssertionError(f"{preempted} preempted requests wait, counted "
                                 f"{self._waiting.num_preempted}")
        if stray := sorted(set(self._units) - set(self.requests)):
            raise AssertionError(f"units of no live request: {', '.join(stray)}")
        swapped = sum(r.status is RequestStatus.PREEMPTED_SWAPPED for r in waiting)
        if swapped != self._num_swapped:
            raise AssertionError(f"{swapped} swapped requests wait, counted {self._num_swapped}")
        # The block manager's own books balance with an orphan table in them: only the
        # requests can tell that a finished (or never added) one still holds blocks.
        holders = {r.request_id for r in self.running}
        if orphans := sorted(set(self.kv.tables) - holders):
            raise IntegrityError(f"block tables of no running request: {', '.join(orphans)}")
        parked = {r.request_id for r in waiting if r.status is RequestStatus.PREEMPTED_SWAPPED}
        if orphans := sorted(set(self.kv.cpu_tables) - parked):
            raise IntegrityError(f"host blocks of no swapped request: {', '.join(orphans)}")

