"""Scheduler behaviour, in the manner of vLLM's CPU scheduler tests: fake outputs."""

from __future__ import annotations

import pytest

from slopilot.engine.config import ConfigError, EngineConfig, PreemptionMode
from slopilot.engine.request import Priority, RequestStatus
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from tests.engine.helpers import make_request, make_scheduler, step, tokens_by_id
from tests.support.fake_executor import FakeExecutor


def test_fcfs_within_class_and_strict_class_order() -> None:
    sched = make_scheduler(token_budget=128, chunk_size=64, max_num_seqs=2)
    sched.add_request(make_request("p2-old", 10, priority=Priority.P2))
    sched.add_request(make_request("p1-a", 10))
    sched.add_request(make_request("p1-b", 10))
    sched.add_request(make_request("p0", 10, priority=Priority.P0))
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["p0", "p1-a"]


def test_prefill_is_chunked_across_steps_and_samples_only_at_the_end() -> None:
    sched = make_scheduler(token_budget=256, chunk_size=256)
    sched.add_request(make_request("a", 1000, max_tokens=2))
    chunks, samples = [], []
    for _ in range(4):
        out = step(sched)
        chunks.append(out.seqs[0].num_tokens)
        samples.append(out.seqs[0].sample)
    assert chunks == [256, 256, 256, 232]
    assert samples == [False, False, False, True]
    assert sched.requests["a"].num_output_tokens == 1


def test_concurrent_partial_prefills_share_the_budget() -> None:
    sched = make_scheduler(token_budget=512, chunk_size=256)
    sched.add_request(make_request("a", 600))
    sched.add_request(make_request("b", 600))
    out = step(sched)
    assert tokens_by_id(out) == {"a": 256, "b": 256}
    out = step(sched)
    assert tokens_by_id(out) == {"a": 256, "b": 256}
    out = step(sched)
    assert tokens_by_id(out) == {"a": 88, "b": 88}


def test_decodes_go_first_and_never_stall_for_a_prefill() -> None:
    sched = make_scheduler(token_budget=128, chunk_size=128)
    for i in range(4):
        sched.add_request(make_request(f"d{i}", 8, max_tokens=50))
    step(sched)  # all four prefill in one step, then decode
    sched.add_request(make_request("long", 1000))
    for _ in range(5):
        out = step(sched)
        sizes = tokens_by_id(out)
        assert all(sizes[f"d{i}"] == 1 for i in range(4))
        assert sizes["long"] == 128 - 4
        assert out.num_batched_tokens <= 128


def test_budget_is_rounded_up_to_the_tile_alignment() -> None:
    cfg = EngineConfig(token_budget=300, budget_align=256, chunk_size=300)
    assert cfg.effective_budget == 512
    assert EngineConfig(token_budget=300, budget_align=1, chunk_size=300).effective_budget == 300


def test_no_chunking_baseline_prefills_whole_prompt_in_one_step() -> None:
    sched = make_scheduler(token_budget=16384, chunk_size=16384)
    sched.add_request(make_request("a", 5000))
    sched.add_request(make_request("b", 3000))
    out = step(sched)
    assert tokens_by_id(out) == {"a": 5000, "b": 3000}


def test_max_num_seqs_caps_running() -> None:
    sched = make_scheduler(max_num_seqs=3)
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 4, max_tokens=10))
    out = step(sched)
    assert len(out.seqs) == 3
    assert sched.num_running == 3 and sched.num_waiting == 2


@pytest.mark.parametrize(("kwargs", "script", "reason", "n_out"), [
    ({"max_tokens": 3}, [5, 6, 7, 8], RequestStatus.FINISHED_LENGTH, 3),
    ({"max_tokens": 9, "ignore_eos": False}, [5, 2, 7], RequestStatus.FINISHED_STOPPED, 2),
    ({"max_tokens": 9, "ignore_eos": True}, [5, 2, 7, 2], RequestStatus.FINISHED_LENGTH, 9),
    ({"max_tokens": 9, "stop_token_ids": frozenset({7})}, [5, 7, 2],
     RequestStatus.FINISHED_STOPPED, 2),
    ({"max_tokens": 9, "ignore_eos": False, "min_tokens": 3}, [2, 2, 2, 2],
     RequestStatus.FINISHED_STOPPED, 3),
])
def test_stop_conditions(kwargs: dict[str, object], script: list[int],
                         reason: RequestStatus, n_out: int) -> None:
    sched = make_scheduler()
    req = make_request("a", 5, **kwargs)  # type: ignore[arg-type]
    req.eos_token_id = 2
    sched.add_request(req)
    ex = FakeExecutor(script={"a": script + [50] * 20})
    for _ in range(20):
        if req.is_finished:
            break
        step(sched, ex)
    assert req.status is reason
    assert req.num_output_tokens == n_out
    assert sched.kv.num_used_blocks == 0
    assert sched.kv.stats().num_cpu_used == 0


def test_preemption_victim_is_lowest_class_then_newest() -> None:
    # 4 blocks of 16 tokens; three requests each hold one block and need a second.
    sched = make_scheduler(num_blocks=4, block_size=16, kv_watermark=0.0,
                           preemption_mode="recompute", max_preemptions_per_step=4)
    sched.add_request(make_request("p1-old", 15, max_tokens=20))
    sched.add_request(make_request("p1-new", 15, max_tokens=20))
    sched.add_request(make_request("p2", 15, max_tokens=20, priority=Priority.P2))
    sched.add_request(make_request("p0", 15, max_tokens=20, priority=Priority.P0))
    step(sched)  # each prefills 15 tokens and samples its 16th
    step(sched)  # the 16th token fills the first block
    out = step(sched)  # the 17th needs a second block each: 4 needed, 0 free
    assert sched.requests["p2"].status is RequestStatus.PREEMPTED_RECOMPUTE
    assert sched.requests["p1-new"].status is RequestStatus.PREEMPTED_RECOMPUTE
    assert {s.request_id for s in out.seqs} == {"p0", "p1-old"}
    assert out.num_preempted_recompute == 2


def test_the_victim_is_the_lowest_class_even_when_it_arrived_first() -> None:
    """Class before arrival: a P2 that came first is preempted before a newer P1. With
    every arrival at 0 (the test above) an order by arrival first looks the same."""
    sched = make_scheduler(num_blocks=2, block_size=16, kv_watermark=0.0,
                           preemption_mode="recompute")
    p2 = make_request("p2-first", 15, max_tokens=20, priority=Priority.P2)
    p1 = make_request("p1-later", 15, max_tokens=20, first_token=5000)
    p2.arrival_time, p1.arrival_time = 1.0, 2.0
    sched.add_request(p2)
    sched.add_request(p1)
    step(sched)
    step(sched)  # both blocks full; each needs a second one for its 17th token
    out = step(sched)
    assert p2.status is RequestStatus.PREEMPTED_RECOMPUTE
    assert p1.status is RequestStatus.RUNNING
    assert [s.request_id for s in out.seqs] == ["p1-later"]


def test_a_recomputed_request_that_fills_the_cache_exactly_still_gets_its_token() -> None:
    """A victim recomputed in chunks whose last chunk ends exactly at the cache's end
    still fits (the cache holds 128 tokens; it samples the 129th), so it ends as the one
    never preempted does (``test_request_that_outgrows...``), not one token short."""
    # No prefix cache: the recompute runs in whole chunks, not from a cached prefix.
    sched = make_scheduler(num_blocks=8, block_size=16, kv_watermark=0.0, chunk_size=64,
                           preemption_mode="recompute", enable_prefix_caching=False)
    long = make_request("long", 100, max_tokens=100)
    sched.add_request(long)
    while long.num_tokens < 128:
        step(sched)
    assert long.num_tokens == 128 and sched.kv.num_free_blocks == 0
    sched.add_request(make_request("p0", 5, max_tokens=1, priority=Priority.P0,
                                   first_token=9000))
    step(sched)
    assert long.status is RequestStatus.PREEMPTED_RECOMPUTE
    while sched.has_work():
        step(sched)
    assert long.status is RequestStatus.FINISHED_LENGTH
    assert long.num_tokens == 129  # recomputed in chunks of 64: the last ends at 128


def test_auto_mode_swaps_a_victim_of_exactly_recompute_max_tokens() -> None:
    """Fewer computed tokens than ``recompute_max_tokens`` are recomputed; as many are
    swapped (the knob's documented rule)."""
    from slopilot.engine.preemption import choose_mode

    for computed, mode in ((15, PreemptionMode.RECOMPUTE), (16, PreemptionMode.SWAP)):
        sched = make_scheduler(num_blocks=4, num_cpu_blocks=4, block_size=16,
                               preemption_mode="auto", recompute_max_tokens=16)
        victim = make_request("v", 16)
        sched.kv.allocate_slots(victim, 16)
        victim.num_computed_tokens = computed
        assert choose_mode(sched.config, sched.kv, victim, 0.0, newcomer=False) is mode


def test_the_watermark_keeps_no_prompt_out_of_an_idle_engine() -> None:
    """The watermark guards running requests; with none running, a prompt that needs all
    but a block of the cache is admitted at once, not kept waiting forever."""
    sched = make_scheduler(num_blocks=10, block_size=16, kv_watermark=0.2,
                           token_budget=256, chunk_size=256)
    sched.add_request(make_request("big", 150, max_tokens=2))
    out = step(sched)
    assert tokens_by_id(out) == {"big": 150}


def test_no_preemption_when_there_is_room() -> None:
    sched = make_scheduler(num_blocks=100)
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 30, max_tokens=30))
    ex = FakeExecutor()
    for _ in range(40):
        out = step(sched, ex)
        assert out.num_preempted_recompute == out.num_preempted_swap == 0
    assert not sched.has_work()


def test_max_preemptions_per_step_limits_victims() -> None:
    sched = make_scheduler(num_blocks=4, kv_watermark=0.0, preemption_mode="recompute",
                           max_preemptions_per_step=1)
    for i in range(4):
        sched.add_request(make_request(f"r{i}", 16, max_tokens=20))
    step(sched)
    out = step(sched)
    assert out.num_preempted_recompute == 1
    # Only one victim freed one block: one request grows, the others stall this step.
    assert len(out.seqs) == 1


def test_knob_change_takes_effect_next_iteration() -> None:
    sched = make_scheduler(token_budget=512, chunk_size=512)
    sched.add_request(make_request("a", 2000))
    assert step(sched).seqs[0].num_tokens == 512
    sched.update_config(sched.config.with_overrides({"chunk_size": 128}))
    assert sched.config.chunk_size == 512  # staged, not applied mid-iteration
    assert step(sched).seqs[0].num_tokens == 128
    with pytest.raises(ConfigError, match="block_size"):
        sched.update_config(sched.config.with_overrides({"block_size": 32}))


def test_swap_out_and_back_in_keeps_computed_tokens() -> None:
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, kv_watermark=0.0,
                           preemption_mode="swap", swap_timeout_ms=1000)
    sched.add_request(make_request("old", 30, max_tokens=40))
    sched.add_request(make_request("new", 30, max_tokens=40))
    ex = FakeExecutor()
    step(sched, ex)
    step(sched, ex)
    swapped = None
    for _ in range(10):
        out = step(sched, ex)
        if out.swap_out:
            swapped = out
            break
    assert swapped is not None
    new = sched.requests["new"]
    assert new.status is RequestStatus.PREEMPTED_SWAPPED
    computed = new.num_computed_tokens
    assert computed > 0 and sched.num_swapped == 1
    for _ in range(200):
        out = step(sched, ex)
        if out.swap_in:
            break
    assert out.swap_in and new.num_computed_tokens >= computed
    while sched.has_work():
        step(sched, ex)
    sched.check_integrity()
    assert sched.kv.num_used_blocks == 0
    assert sched.kv.stats().num_cpu_used == 0


def test_swap_slower_than_timeout_never_happens() -> None:
    # A running request that must grow gets its victim recomputed instead...
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, kv_watermark=0.0,
                           swap_s_per_block=0.1, preemption_mode="swap",
                           swap_timeout_ms=50)
    sched.add_request(make_request("a", 30, max_tokens=40))
    sched.add_request(make_request("b", 30, max_tokens=40))
    outs = [step(sched) for _ in range(5)]
    assert not any(o.swap_out for o in outs)
    assert sum(o.num_preempted_recompute for o in outs) == 1
    # ...while a waiting P0 newcomer does not preempt at all: it waits.
    sched = make_scheduler(num_blocks=4, num_cpu_blocks=8, kv_watermark=0.0,
                           swap_s_per_block=0.1, preemption_mode="swap",
                           swap_timeout_ms=50, p0_preempt_utilization=0.1)
    sched.add_request(make_request("p1", 60, max_tokens=20))
    step(sched)
    sched.add_request(make_request("p0", 10, priority=Priority.P0))
    out = step(sched)
    assert "p0" not in tokens_by_id(out) and not out.swap_out
    assert sched.requests["p1"].status is RequestStatus.RUNNING


def test_p0_preempts_p1_only_above_utilization_threshold() -> None:
    for threshold, expect_preempt in ((0.5, True), (1.0, False)):
        sched = make_scheduler(num_blocks=4, kv_watermark=0.0, preemption_mode="recompute",
                               p0_preempt_utilization=threshold)
        sched.add_request(make_request("p1", 60, max_tokens=20))
        step(sched)
        sched.add_request(make_request("p0", 10, priority=Priority.P0))
        out = step(sched)
        got = "p0" in tokens_by_id(out)
        assert got is expect_preempt
        assert (sched.requests["p1"].status is RequestStatus.PREEMPTED_RECOMPUTE) \
            is expect_preempt


def test_recomputed_victim_rehits_its_cached_prefix() -> None:
    sched = make_scheduler(num_blocks=6, kv_watermark=0.0, preemption_mode="recompute",
                           p0_preempt_utilization=0.1)
    victim = make_request("victim", 64, max_tokens=10)
    sched.add_request(victim)
    step(sched)
    sched.add_request(make_request("p0", 40, priority=Priority.P0, first_token=5000))
    step(sched)
    assert victim.status is RequestStatus.PREEMPTED_RECOMPUTE
    while "p0" in sched.requests:
        step(sched)
    hits_before = sched.prefix_hits
    step(sched)
    assert victim.status is RequestStatus.RUNNING
    # It had four full blocks cached; P0 needed three of the six blocks, and the free
    # list held two, so the victim's tail block (freed first, so least recent) went.
    assert victim.num_cached_tokens == 48
    # Not a hit, nor a query, of the exported counters: vLLM keeps a preempted request's
    # lookups apart (PrefixCacheStats.preempted_*, no series); counted, thrash read as a
    # working cache (tests/engine/test_vllm_series_semantics.py has the other cases).
    assert sched.prefix_hits == hits_before
    assert sched.prefix_queries == 64 + 40


def test_prefix_cache_shares_blocks_between_requests() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 100, max_tokens=2))
    while sched.has_work():
        step(sched)
    b = make_request("b", 100, max_tokens=2)
    sched.add_request(b)
    out = step(sched)
    assert b.num_cached_tokens == 96  # six full blocks; the last token is recomputed
    assert out.seqs[0].start_pos == 96 and out.seqs[0].num_tokens == 4


def test_abort_frees_blocks_everywhere() -> None:
    sched = make_scheduler(num_blocks=50)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 40, max_tokens=50))
    step(sched)
    sched.add_request(make_request("waiting", 10))
    for rid in ["r0", "r1", "r2", "waiting"]:
        assert sched.abort_request(rid) is not None
    assert sched.abort_request("nope") is None
    out = sched.schedule()
    assert not out.seqs and set(out.finished_ids) == {"r0", "r1", "r2", "waiting"}
    assert sched.kv.num_used_blocks == 0 and not sched.has_work()
    sched.check_integrity()


def test_bad_requests_are_refused_clearly() -> None:
    sched = make_scheduler(num_blocks=4, max_waiting=2)
    sched.add_request(make_request("a", 5))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("a", 5))
    with pytest.raises(PromptTooLongError, match="cannot fit"):
        sched.add_request(make_request("huge", 64))
    sched.add_request(make_request("b", 5))
    with pytest.raises(QueueFullError, match="max_waiting=2"):
        sched.add_request(make_request("c", 5))
    # With the queue full, a prompt that can never fit is still the client's error (400,
    # not worth a retry), not load (429, counted as a client turned away).
    with pytest.raises(PromptTooLongError, match="cannot fit"):
        sched.add_request(make_request("huge-while-full", 64))


def test_request_that_outgrows_the_cache_ends_with_length_and_is_reported() -> None:
    from tests.engine.helpers import make_engine

    class Seen:
        def __init__(self) -> None:
            self.finished: list[str] = []

        def on_step(self, *args: object) -> None: ...
        def on_first_token(self, *args: object) -> None: ...
        def on_token_gap(self, *args: object) -> None: ...

        def on_finished(self, req: object, now: float) -> None:
            self.finished.append(req.request_id)  # type: ignore[attr-defined]

    engine = make_engine(num_blocks=2)  # 32 tokens of KV in all
    seen = Seen()
    engine.observers.append(seen)  # type: ignore[arg-type]
    req = make_request("long", 20, max_tokens=100)
    engine.add_request(req)
    engine.run_until_idle()
    assert req.status is RequestStatus.FINISHED_LENGTH
    # 32 tokens fill the cache; the 33rd was sampled but has no slot to be fed into.
    assert req.num_tokens == 33 and req.finished_time is not None
    assert seen.finished == ["long"]
    assert engine.scheduler.kv.num_used_blocks == 0


def test_a_request_ended_from_outside_keeps_the_status_given() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("stopped", 5, max_tokens=9))
    step(sched)
    req = sched.abort_request("stopped", RequestStatus.FINISHED_STOPPED)
    assert req is not None and req.finish_reason is not None
    assert req.finish_reason.value == "stop"
    with pytest.raises(ValueError, match="FINISHED_"):
        sched.abort_request("x", RequestStatus.RUNNING)


def test_phases_follow_the_lifecycle() -> None:
    from slopilot.engine.request import RequestPhase

    sched = make_scheduler(token_budget=128, chunk_size=64, num_blocks=10, kv_watermark=0.0,
                           preemption_mode="recompute")
    req = make_request("a", 100, max_tokens=80)
    assert req.phase is RequestPhase.WAITING
    sched.add_request(req)
    step(sched)
    assert req.phase is RequestPhase.PREFILLING  # 64 of 100 prompt tokens in
    step(sched)
    assert req.phase is RequestPhase.DECODING
    # A P0 newcomer under pressure pushes it out: it must recompute its history.
    sched.update_config(sched.config.with_overrides({"p0_preempt_utilization": 0.1}))
    sched.add_request(make_request("p0", 90, priority=Priority.P0, first_token=9000))
    step(sched)
    assert req.phase is RequestPhase.PREEMPTED_RECOMPUTE
    while sched.has_work():
        step(sched)
    assert req.phase is RequestPhase.FINISHED and req.finish_reason is not None


def test_logprobs_are_recorded_once_per_position_across_a_recompute() -> None:
    # A P2 prompt in chunks of 64 is preempted (recompute) by a P0 halfway through, then
    # prefilled again from the start: each prompt position keeps exactly one entry.
    sched = make_scheduler(num_blocks=12, token_budget=128, chunk_size=64,
                           p0_preempt_utilization=0.0, preemption_mode="recompute",
                           kv_watermark=0.0)
    slow = make_request("slow", 150, max_tokens=3, priority=Priority.P2, prompt_logprobs=0,
                        logprobs=0, first_token=0)
    sched.add_request(slow)
    step(sched)
    step(sched)  # 128 of the 150 prompt tokens, one chunk per step
    assert len(slow.prompt_logprobs) == 128
    sched.add_request(make_request("rush", 100, max_tokens=1, priority=Priority.P0,
                                   first_token=5000))
    out = step(sched)
    assert out.num_preempted_recompute == 1 and slow.num_computed_tokens == 0
    while sched.requests:
        step(sched)
    assert slow.num_preemptions == 1 and slow.num_output_tokens == 3
    # Entry j predicts prompt token j + 1; the fake executor tags it with its position.
    assert [e.token_id for e in slow.prompt_logprobs] == slow.prompt_token_ids[1:]
    assert [e.logprob for e in slow.prompt_logprobs] == [-(j + 1) / 1000 for j in range(149)]
    assert [e.token_id for e in slow.output_logprobs] == slow.output_token_ids


def test_the_integrity_check_finds_a_block_table_no_live_request_holds() -> None:
    """A table left behind by a request that finished (or was never added) keeps its
    blocks from every other request for good, and the block manager's own bookkeeping
    stays consistent with it: only the requests can tell it is an orphan."""
    from slopilot.engine.kv_integrity import IntegrityError

    sched = make_scheduler(num_blocks=16)
    sched.add_request(make_request("a", prompt_len=20, max_tokens=2))
    step(sched)
    sched.check_integrity()
    ghost = make_request("ghost", prompt_len=20, max_tokens=2)
    assert sched.kv.allocate_slots(ghost, 20)
    with pytest.raises(IntegrityError, match="ghost"):
        sched.check_integrity()



def test_a_prompt_past_the_models_context_is_refused_at_the_engine() -> None:
    """A caller that adds requests to the engine itself (the calibration replay, a
    program embedding it) gets the server's rule: a prompt that leaves no room for one
    token under the model's context is refused, however much KV cache there is."""
    from slopilot.engine.scheduler import Scheduler

    cfg = EngineConfig().with_overrides({"budget_align": 1})
    sched = Scheduler(cfg, 1000, 0, 0.0, max_model_len=32)  # KV: 16,000 tokens
    with pytest.raises(PromptTooLongError, match="context of 32"):
        sched.add_request(make_request("whole-context", 32))
    sched.add_request(make_request("room-for-one", 31, max_tokens=1))


def test_generation_stops_at_the_models_context() -> None:
    """vLLM's engine caps a request at max_model_len (finished by length) whatever its
    max_tokens: past it the model would run at positions it does not have."""
    from tests.engine.helpers import make_engine

    engine = make_engine(num_blocks=1000)
    engine.scheduler.max_model_len = 32
    req = make_request("long-ask", 28, max_tokens=100)
    engine.add_request(req)
    engine.run_until_idle()
    assert len(req.output_token_ids) == 4  # 28 + 4: the context's 32 positions
    assert req.status is RequestStatus.FINISHED_LENGTH
    engine.scheduler.check_integrity()
