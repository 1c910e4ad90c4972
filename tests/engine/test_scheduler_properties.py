"""Property tests: random workloads and knobs; the scheduler's invariants (budget kept, no
decode skipped, blocks conserved, each request ends once, class order for admission and
for the prefill budget, a waiting P0 never held back by lower classes' prefills) after
every step."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.request import Priority, Request, RequestStatus, SamplingParams
from slopilot.engine.scheduler import Scheduler
from tests.support.fake_executor import FakeExecutor

knobs = st.fixed_dictionaries({
    "token_budget": st.integers(128, 1024),
    "budget_align": st.sampled_from([1, 64, 128, 256]),
    "chunk_size": st.integers(64, 128),
    "max_num_seqs": st.integers(1, 32),
    "preemption_mode": st.sampled_from(list(PreemptionMode)),
    "recompute_max_tokens": st.integers(0, 300),
    "max_preemptions_per_step": st.integers(0, 4),
    "swap_timeout_ms": st.sampled_from([0.0, 5.0, 1000.0]),
    "p0_preempt_utilization": st.floats(0.0, 1.0),
    "kv_watermark": st.floats(0.0, 0.3),
    "enable_prefix_caching": st.booleans(),
})

request_st = st.tuples(
    st.integers(0, 12),  # arrival step
    st.integers(1, 300),  # prompt length
    st.integers(1, 40),  # max tokens
    st.sampled_from(list(Priority)),
    st.integers(0, 3),  # shared-prefix family: same first tokens
    st.booleans(),  # aborted at some point
)


def _rank(r: Request) -> tuple[int, float, int]:
    return (r.priority, r.arrival_time, r.seq_no)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=knobs, new_knobs=knobs, requests=st.lists(request_st, min_size=1, max_size=25),
       num_blocks=st.integers(24, 120), num_cpu_blocks=st.integers(0, 64),
       change_at=st.integers(0, 30), abort_at=st.integers(0, 40))
def test_invariants_hold_after_every_step(
        knobs: dict[str, object], new_knobs: dict[str, object],
        requests: list[tuple[int, int, int, Priority, int, bool]], num_blocks: int,
        num_cpu_blocks: int, change_at: int, abort_at: int) -> None:
    knobs["chunk_size"] = min(int(knobs["chunk_size"]), int(knobs["token_budget"]))  # type: ignore[call-overload]
    new_knobs["chunk_size"] = min(int(new_knobs["chunk_size"]), int(new_knobs["token_budget"]))  # type: ignore[call-overload]
    cfg = EngineConfig().with_overrides(knobs)
    sched = Scheduler(cfg, num_blocks, num_cpu_blocks, swap_s_per_block=0.002)
    ex = FakeExecutor()
    pending = sorted(enumerate(requests), key=lambda x: x[1][0])
    finished: list[str] = []
    all_reqs: dict[str, Request] = {}
    step_no = 0
    while pending or sched.has_work():
        while pending and pending[0][1][0] <= step_no:
            i, (_, plen, max_tok, prio, family, _) = pending.pop(0)
            prompt = [10_000 * (family + 1) + t for t in range(plen)]
            req = Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tok, ignore_eos=True),
                          priority=prio)
            try:
                sched.add_request(req)
            except ValueError:
                continue  # too long for this cache: refused up front, never started
            all_reqs[req.request_id] = req
        if step_no == change_at:
            sched.update_config(sched.config.with_overrides(new_knobs))
        if step_no == abort_at:
            for i, spec in enumerate(requests):
                rid = f"r{i}"
                if spec[5] and rid in sched.requests:
                    sched.abort_request(rid)
                    finished.append(rid)

        decoding_before = [r for r in sched.running if r.num_tokens - r.num_computed_tokens == 1]
        running_before = len(sched.running)
        waiting_before = {rid for rid, r in sched.requests.items()
                          if r.status is not RequestStatus.RUNNING}
        out = sched.schedule()
        cfg_now = sched.config

        # Budget never exceeded; no chunk above chunk_size; the counts add up.
        assert out.num_batched_tokens <= cfg_now.effective_budget
        assert out.num_batched_tokens == sum(s.num_tokens for s in out.seqs)
        assert out.num_prefill_tokens == sum(s.num_tokens for s in out.seqs if s.is_prefill)
        assert all(s.num_tokens <= max(1, cfg_now.chunk_size) for s in out.seqs)
        preempted = out.num_preempted_recompute + out.num_preempted_swap
        if preempted > cfg_now.max_preemptions_per_step:
            # Past the cap only to unblock a step that would otherwise do nothing.
            assert out.seqs
        # No running decode skipped unless the KV could not make room for it, whatever
        # the budget: no more run than one budget can decode (a live cut preempts the
        # excess), so a decode goes at most one iteration without its token.
        assert len(sched.running) <= cfg_now.effective_budget
        scheduled = {s.request_id for s in out.seqs}
        if out.num_stalled == 0:
            for r in decoding_before:
                assert r.request_id in scheduled or r.status is not RequestStatus.RUNNING
        # Strict priority for the budget too: after the decodes, prefill rows come class
        # by class, so no P1/P2 chunk is planned before a P0's.
        decoding_ids = {r.request_id for r in decoding_before}
        prefill_classes = [all_reqs[s.request_id].priority for s in out.seqs
                           if s.request_id not in decoding_ids]
        assert prefill_classes == sorted(prefill_classes)
        # Class order: everyone still waiting ranks after everyone admitted this step.
        admitted = [all_reqs[rid] for rid in waiting_before if rid in scheduled]
        # Admission respects max_num_seqs, at most the budget. A live decrease of the knob
        # lets running drain down; meanwhile a P0 may only take one P1/P2's slot.
        assert not admitted or len(sched.running) <= max(
            cfg_now.effective_max_num_seqs, running_before)
        still_waiting = [r for r in sched.requests.values()
                         if r.status is not RequestStatus.RUNNING and r.num_preemptions == 0]
        if admitted and still_waiting:
            assert max(_rank(r) for r in admitted if r.num_preemptions == 0) \
                < min(_rank(r) for r in still_waiting) if any(
                    r.num_preemptions == 0 for r in admitted) else True

        result = ex.execute(out)
        update = sched.update_from_output(out, result)
        assert all(r.is_finished for r in update.finished)
        finished.extend(r.request_id for r in update.finished)
        sched.check_integrity()
        step_no += 1
        assert step_no < 3000, "no progress"

    # Every request ends exactly once; no blocks used at the end.
    assert sorted(finished) == sorted(all_reqs)
    assert all(r.is_finished for r in all_reqs.values())
    assert sched.kv.num_used_blocks == 0
    assert sched.kv.stats().num_cpu_used == 0
    for r in all_reqs.values():
        if r.status is not RequestStatus.FINISHED_ABORTED:
            assert r.num_output_tokens <= r.sampling.max_tokens


# A cache too large to ever run short, so that only the budget and the seq slots can hold
# a waiting P0 back: what is left of the budget after the decodes and the P0s' own partial
# prefills must go to the oldest waiting P0, never to a P1/P2 prefill.
roomy_knobs = st.fixed_dictionaries({
    "token_budget": st.integers(128, 512),
    "budget_align": st.sampled_from([1, 64]),
    "chunk_size": st.integers(64, 128),
    "max_num_seqs": st.integers(1, 16),
    "preemption_mode": st.sampled_from(list(PreemptionMode)),
    "max_preemptions_per_step": st.integers(0, 3),
    "p0_preempt_utilization": st.floats(0.0, 1.0),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs=roomy_knobs, requests=st.lists(
    st.tuples(st.integers(0, 12), st.integers(1, 600), st.integers(1, 20),
              st.sampled_from(list(Priority))), min_size=1, max_size=20))
def test_a_waiting_p0_gets_the_budget_left_after_the_decodes(
        knobs: dict[str, object], requests: list[tuple[int, int, int, Priority]]) -> None:
    knobs["chunk_size"] = min(int(knobs["chunk_size"]), int(knobs["token_budget"]))  # type: ignore[call-overload]
    cfg = EngineConfig().with_overrides(knobs)
    sched = Scheduler(cfg, 10_000, 10_000)
    ex = FakeExecutor()
    pending = sorted(enumerate(requests), key=lambda x: x[1][0])
    step_no = 0
    while pending or sched.has_work():
        while pending and pending[0][1][0] <= step_no:
            i, (_, plen, max_tok, prio) = pending.pop(0)
            sched.add_request(Request(f"r{i}", [10 * i + t for t in range(plen)],
                                      SamplingParams(max_tokens=max_tok, ignore_eos=True),
                                      priority=prio))
        running = list(sched.running)
        decoding = {r.request_id for r in running if r.num_tokens - r.num_computed_tokens == 1}
        p0_partials = {r.request_id for r in running
                       if r.priority is Priority.P0 and r.request_id not in decoding}
        waiting_p0 = sorted((r for r in sched.requests.values()
                             if r.status is not RequestStatus.RUNNING
                             and r.priority is Priority.P0), key=_rank)
        out = sched.schedule()
        rows = {s.request_id: s.num_tokens for s in out.seqs}
        if waiting_p0:
            head = waiting_p0[0]
            left = cfg.effective_budget - sum(rows.get(rid, 0) for rid in decoding) \
                - sum(rows.get(rid, 0) for rid in p0_partials)
            # A full slot table holds it back only when no P1/P2 runs to give up a slot,
            # or when no preemption is allowed at all.
            slot_held = len(running) >= cfg.effective_max_num_seqs and (
                cfg.max_preemptions_per_step == 0
                or all(r.priority is Priority.P0 for r in running))
            if left > 0 and not slot_held:
                assert head.request_id in rows, (head.request_id, left, rows)
        sched.update_from_output(out, ex.execute(out))
        sched.check_integrity()
        step_no += 1
        assert step_no < 3000, "no progress"
