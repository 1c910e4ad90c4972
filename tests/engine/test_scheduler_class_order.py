"""Strict priority for the prefill budget, and for the seq slots (found by an outside review).

After the decodes, the budget goes to prefill work class by class: a class's partial
prefills, then its waiting requests, before any lower class's. Before this, partial
prefills of every class came first, so a 3-token P0 waited ~31 iterations behind two
running P2 prompts of 16,000 tokens on a nearly empty cache. And a waiting P0 may take a
seq slot from P1/P2 when every slot is taken; before, the max_num_seqs check came before
the P0 was even looked at, and it waited for a P2 batch job to finish.
"""

from __future__ import annotations

from slopilot.engine.request import Priority, RequestStatus
from slopilot.engine.scheduler import Scheduler
from tests.engine.helpers import make_request, make_scheduler, step, tokens_by_id
from tests.support.fake_executor import FakeExecutor


def _order(out: object) -> list[str]:
    return [s.request_id for s in out.seqs]  # type: ignore[attr-defined]


def _prefills_behind_p2(sched: Scheduler) -> None:
    for i in range(2):
        sched.add_request(make_request(f"p2-{i}", 16_000, max_tokens=10,
                                       priority=Priority.P2, first_token=100_000 * (i + 1)))
    step(sched)  # both are now partial prefills, 512 tokens each per step


def test_a_waiting_p0_goes_before_running_p2_prefills() -> None:
    sched = make_scheduler(num_blocks=100_000)  # default knobs: budget 1024, chunk 512
    _prefills_behind_p2(sched)
    sched.add_request(make_request("p0", 3, max_tokens=1, priority=Priority.P0))
    out = step(sched)
    # The P0 is admitted first and samples its first token in this very iteration; the
    # P2 prefills share what is left of the budget instead of all of it.
    assert _order(out)[0] == "p0" and out.seqs[0].sample
    assert tokens_by_id(out) == {"p0": 3, "p2-0": 512, "p2-1": 509}
    assert out.num_batched_tokens == 1024
    assert sched.requests.get("p0") is None  # max_tokens 1: it has finished
    assert out.num_preempted_recompute == out.num_preempted_swap == 0


def test_each_class_prefills_before_the_next_partials_first_within_a_class() -> None:
    sched = make_scheduler(num_blocks=10_000, token_budget=512, chunk_size=256)
    sched.add_request(make_request("p1-old", 600, first_token=10_000))
    sched.add_request(make_request("p2-old", 600, priority=Priority.P2, first_token=20_000))
    step(sched)  # p1-old 256, p2-old 256: both partial now
    sched.add_request(make_request("p2-new", 50, priority=Priority.P2, first_token=30_000))
    sched.add_request(make_request("p1-new", 50, first_token=40_000))
    out = step(sched)
    # P1: its partial prefill, then its admission; P2's partial only gets what is left,
    # and the P2 newcomer nothing.
    assert _order(out) == ["p1-old", "p1-new", "p2-old"]
    assert tokens_by_id(out) == {"p1-old": 256, "p1-new": 50, "p2-old": 206}


def test_decodes_still_go_before_a_waiting_p0() -> None:
    sched = make_scheduler(num_blocks=10_000, token_budget=256, chunk_size=256)
    for i in range(3):
        sched.add_request(make_request(f"d{i}", 8, max_tokens=50, priority=Priority.P2,
                                       first_token=1000 * (i + 1)))
    step(sched)  # all three decode from now on
    sched.add_request(make_request("p0", 2000, priority=Priority.P0, first_token=50_000))
    out = step(sched)
    assert tokens_by_id(out) == {"d0": 1, "d1": 1, "d2": 1, "p0": 253}


def test_p0_behind_p2_prefills_gets_its_first_token_in_one_iteration() -> None:
    # The review's figure: under the old order the P0 waited ~31 iterations.
    sched = make_scheduler(num_blocks=100_000)
    ex = FakeExecutor()
    _prefills_behind_p2(sched)
    p0 = make_request("p0", 3, max_tokens=1, priority=Priority.P0)
    sched.add_request(p0)
    iterations = 0
    while not p0.output_token_ids:
        step(sched, ex)
        iterations += 1
        assert iterations <= 100
    assert iterations == 1


# ---------------------------------------------------------------- seq slots (defect 3)

def _slots_full(max_num_seqs: int = 2, **knobs: object) -> Scheduler:
    """Two P2 batch jobs of 250 tokens in 40 blocks of 16: usage ~0.8, both slots full."""
    cfg: dict[str, object] = {
        "token_budget": 512, "chunk_size": 512, "max_num_seqs": max_num_seqs,
        "p0_preempt_utilization": 0.5, "kv_watermark": 0.0, "preemption_mode": "recompute",
        **knobs}
    sched = make_scheduler(40, **cfg)
    for name, first in (("p2-a", 1000), ("p2-b", 5000)):
        sched.add_request(make_request(name, 250, max_tokens=2000, priority=Priority.P2,
                                       first_token=first))
    for _ in range(3):
        step(sched)
    return sched


def test_p0_takes_a_slot_from_the_newest_p2_when_slots_are_full() -> None:
    sched = _slots_full()
    assert sched.num_running == 2 and sched.kv.usage > 0.5
    sched.add_request(make_request("p0", 100, max_tokens=5, priority=Priority.P0,
                                   first_token=9000))
    out = step(sched)
    assert "p0" in tokens_by_id(out)
    assert sched.requests["p2-b"].status is RequestStatus.PREEMPTED_RECOMPUTE
    assert sched.requests["p2-a"].status is RequestStatus.RUNNING
    assert out.num_preempted_recompute == 1 and sched.num_running == 2
    sched.check_integrity()


def test_a_full_slot_table_is_its_own_shortage_whatever_the_kv_usage() -> None:
    # Usage is 0.8, under a 0.9 threshold, and the P0's block is free: only a slot is short.
    sched = _slots_full(p0_preempt_utilization=0.9)
    sched.add_request(make_request("p0", 10, max_tokens=5, priority=Priority.P0,
                                   first_token=9000))
    out = step(sched)
    assert "p0" in tokens_by_id(out)
    assert out.num_preempted_recompute == 1
    assert sched.requests["p2-b"].status is RequestStatus.PREEMPTED_RECOMPUTE


def test_slot_preemption_never_takes_a_p0_and_respects_the_cap() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("p0-old", 10, max_tokens=50, priority=Priority.P0))
    step(sched)
    sched.add_request(make_request("p0-new", 10, priority=Priority.P0, first_token=5000))
    out = step(sched)
    assert "p0-new" not in tokens_by_id(out) and out.num_preempted_recompute == 0
    # No preemption at all when the cap is 0: the P0 waits for the slot.
    sched = _slots_full(max_preemptions_per_step=0)
    sched.add_request(make_request("p0", 10, priority=Priority.P0, first_token=9000))
    out = step(sched)
    assert "p0" not in tokens_by_id(out)
    assert out.num_preempted_recompute == out.num_preempted_swap == 0


def test_a_slot_is_taken_only_when_the_p0_would_then_fit() -> None:
    # Under the KV threshold, the P0 may preempt for a slot, not for blocks: one victim's
    # 16 blocks plus the 4 free cannot hold a 500-token first chunk (32 blocks), so
    # nobody's work is thrown away for nothing.
    sched = _slots_full(p0_preempt_utilization=0.95)
    free = sched.kv.num_free_blocks
    assert free < 32 and sched.kv.usage < 0.95
    sched.add_request(make_request("p0", 500, priority=Priority.P0, first_token=9000))
    out = step(sched)
    assert "p0" not in tokens_by_id(out)
    assert out.num_preempted_recompute == 0


def test_after_a_live_cut_of_max_num_seqs_a_p0_takes_one_slot_not_the_whole_cut() -> None:
    # Four P2 decode; max_num_seqs is cut to 2 live: they drain as they finish, and a P0
    # swaps in for one of them instead of preempting everyone past the new value.
    sched = make_scheduler(max_num_seqs=4, preemption_mode="recompute")
    for i in range(4):
        sched.add_request(make_request(f"p2-{i}", 10, max_tokens=50, priority=Priority.P2,
                                       first_token=1000 * (i + 1)))
    step(sched)
    sched.update_config(sched.config.with_overrides({"max_num_seqs": 2}))
    out = step(sched)
    assert sched.num_running == 4 and out.num_preempted_recompute == 0  # drains
    sched.add_request(make_request("p0", 10, priority=Priority.P0, first_token=9000))
    out = step(sched)
    assert "p0" in tokens_by_id(out) and out.num_preempted_recompute == 1
    assert sched.requests["p2-3"].status is RequestStatus.PREEMPTED_RECOMPUTE
    assert sched.num_running == 4
    sched.check_integrity()
