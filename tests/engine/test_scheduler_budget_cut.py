"""No running decode is ever skipped, even after a live cut of the budget (an outside review).

One iteration gives each running decode one token, so no more requests may run than one
budget can decode: the engine runs at most ``effective_max_num_seqs`` (max_num_seqs, at
most the budget), and when a live change leaves more running than the new budget, the
excess is preempted at once by the victim rule instead of being skipped. Before, 300
decodes under a budget cut to 128 left the tail of ``running`` (rank order, so the same
tail every step) without a token for 391 iterations, with nothing preempted or reported.
"""

from __future__ import annotations

import pytest

from slopilot.engine.config import EngineConfig, PreemptionMode
from slopilot.engine.request import Priority, Request, RequestStatus
from slopilot.engine.scheduler import Scheduler
from tests.engine.helpers import make_request, make_scheduler, step
from tests.support.fake_executor import FakeExecutor


def _decoding(sched: Scheduler) -> list[Request]:
    return [r for r in sched.running if r.num_tokens - r.num_computed_tokens == 1]


def _start_300(num_cpu_blocks: int = 0, **knobs: object) -> tuple[Scheduler, list[Request]]:
    """300 short requests, the 10 oldest of them P2, all decoding under a 1024 budget."""
    sched = make_scheduler(4000, num_cpu_blocks, **{"token_budget": 1024, "chunk_size": 512,
                                                    "max_num_seqs": 300, **knobs})
    reqs = [make_request(f"r{i}", 4, max_tokens=200, first_token=10 * i,
                         priority=Priority.P2 if i < 10 else Priority.P1)
            for i in range(300)]
    for r in reqs:
        sched.add_request(r)
    for _ in range(3):
        step(sched)
    assert len(_decoding(sched)) == 300
    return sched, reqs


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_a_live_budget_cut_preempts_the_excess_by_the_victim_rule(
        mode: PreemptionMode) -> None:
    # Host room for every victim, so that a swap is never refused for want of it.
    sched, reqs = _start_300(num_cpu_blocks=4000, preemption_mode=mode.value)
    sched.update_config(sched.config.with_overrides({"token_budget": 128, "chunk_size": 64}))
    out = step(sched)
    preempted = out.num_preempted_swap if mode is PreemptionMode.SWAP \
        else out.num_preempted_recompute
    # 172 over the new budget, lowest class first (the 10 P2, oldest as they are), then
    # the newest P1s; every one of the 128 left got its token.
    assert preempted == 172 and sched.num_preemptions[mode] == 172
    assert out.num_preempted_recompute + out.num_preempted_swap == 172
    kept = {r.request_id for r in sched.running}
    assert kept == {f"r{i}" for i in range(10, 138)}
    assert {s.request_id for s in out.seqs} == kept and out.num_batched_tokens == 128
    assert all(r.status is not RequestStatus.RUNNING for r in reqs
               if r.request_id not in kept)
    sched.check_integrity()


def test_after_a_live_budget_cut_no_decode_waits_more_than_one_iteration() -> None:
    sched, reqs = _start_300()
    ex = FakeExecutor()
    sched.update_config(sched.config.with_overrides({"token_budget": 128, "chunk_size": 64}))
    last: dict[str, tuple[int, int]] = {}  # request -> (iteration, preemptions) of its token
    worst = 0
    for it in range(3000):
        out = sched.schedule()
        assert len(sched.running) <= 128
        update = sched.update_from_output(out, ex.execute(out))
        for r in update.new_tokens:
            prev = last.get(r.request_id)
            if prev is not None and prev[1] == r.num_preemptions:
                worst = max(worst, it - prev[0])
            last[r.request_id] = (it, r.num_preemptions)
        if not sched.has_work():
            break
    assert not sched.has_work()
    assert worst == 1  # the review's run: 391 iterations
    assert all(r.num_output_tokens == 200 for r in reqs)


def test_the_budget_caps_how_many_requests_run() -> None:
    # max_num_seqs 256 under a budget of 128: at most 128 run, and every decode is served.
    sched = make_scheduler(4000, token_budget=128, chunk_size=64, max_num_seqs=256)
    assert sched.config.effective_max_num_seqs == 128
    for i in range(200):
        sched.add_request(make_request(f"r{i}", 2, max_tokens=30, first_token=10 * i))
    for _ in range(20):
        decoding = {r.request_id for r in _decoding(sched)}
        out = step(sched)
        assert sched.num_running <= 128
        assert decoding <= {s.request_id for s in out.seqs}
    assert sum(sched.num_preemptions.values()) == 0


def test_effective_max_num_seqs_is_the_knob_at_most_the_aligned_budget() -> None:
    assert EngineConfig().effective_max_num_seqs == 256
    cfg = EngineConfig(token_budget=128, budget_align=1, chunk_size=64, max_num_seqs=4096)
    assert cfg.effective_max_num_seqs == 128
    # The budget the engine runs is the aligned one: 130 rounds up to 256.
    cfg = EngineConfig(token_budget=130, budget_align=256, chunk_size=64, max_num_seqs=4096)
    assert cfg.effective_max_num_seqs == 256
    assert EngineConfig(max_num_seqs=8).effective_max_num_seqs == 8
