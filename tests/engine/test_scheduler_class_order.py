"""Strict priority for the prefill budget (outside review, repro3).

After the decodes, the budget goes to prefill work class by class: a class's partial
prefills, then its waiting requests, before any lower class's. Before this, partial
prefills of every class came first, so a 3-token P0 waited ~31 iterations behind two
running P2 prompts of 16,000 tokens on a nearly empty cache.
"""

from __future__ import annotations

from slopilot.engine.request import Priority
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
