"""A full waiting queue makes room for a more urgent class (the review's lock-out).

With the queue at ``max_waiting``, every class was refused alike: a batch (P2) client
retrying its 429s kept the queue full and every P0 was refused, each one a P0 miss. Now
the newest P2 (or else P1) request that has not started gives way to the newcomer and is
answered as a refusal of its own class; equal or higher classes never give way, and a
preempted request (its client has tokens already) never does.
"""

from __future__ import annotations

import pytest

from slopilot.engine.request import Priority, Request, RequestStatus
from slopilot.engine.scheduler import QueueFullError, Scheduler
from tests.engine.helpers import make_engine, make_request, make_scheduler, step

P0, P1, P2 = Priority.P0, Priority.P1, Priority.P2


def _req(rid: str, priority: Priority, n: int = 0) -> Request:
    # Distinct prompts: nothing shared through the prefix cache.
    return make_request(rid, 5, max_tokens=50, priority=priority, first_token=100 * (n + 1))


def _full(priorities: list[Priority], max_waiting: int | None = None) -> Scheduler:
    """A scheduler whose one running request holds the only seq slot, and whose waiting
    queue holds ``priorities`` in that arrival order (full at ``max_waiting``)."""
    sched = make_scheduler(max_num_seqs=1, max_waiting=max_waiting or len(priorities))
    sched.add_request(_req("running", P0, 99))
    step(sched)
    for i, p in enumerate(priorities):
        sched.add_request(_req(f"w{i}-{p.label}", p, i))
    assert sched.num_waiting == len(priorities)
    return sched


def test_a_p0_displaces_the_newest_p2_that_has_not_started() -> None:
    sched = _full([P2, P2, P2])
    displaced = sched.add_request(_req("urgent", P0, 50))
    assert [r.request_id for r in displaced] == ["w2-p2"]
    gone = displaced[0]
    assert gone.status is RequestStatus.FINISHED_ABORTED and gone.request_id not in sched.requests
    assert sched.num_waiting == 3 and "urgent" in sched.requests
    sched.check_integrity()


@pytest.mark.parametrize("newcomer", [P2, P1])
def test_an_equal_or_more_urgent_class_never_gives_way(newcomer: Priority) -> None:
    sched = _full([P1, P0])
    with pytest.raises(QueueFullError):
        sched.add_request(_req("late", newcomer, 50))
    assert set(sched.requests) == {"running", "w0-p1", "w1-p0"}
    sched.check_integrity()


def test_the_lowest_class_gives_way_first_then_the_next() -> None:
    sched = _full([P2, P1, P2, P1])
    assert [r.request_id for r in sched.add_request(_req("a", P0, 50))] == ["w2-p2"]
    assert [r.request_id for r in sched.add_request(_req("b", P1, 51))] == ["w0-p2"]
    # No P2 left: a P0 takes the newest P1 (b, which arrived last), a P1 nobody.
    assert [r.request_id for r in sched.add_request(_req("c", P0, 52))] == ["b"]
    with pytest.raises(QueueFullError):
        sched.add_request(_req("d", P1, 53))
    assert sorted(sched.requests) == ["a", "c", "running", "w1-p1", "w3-p1"]
    sched.check_integrity()


def _two_preempted_p2() -> Scheduler:
    """Two P2 ran and were preempted by two P0 taking their seq slots (one a step)."""
    sched = make_scheduler(max_num_seqs=2, max_waiting=2)
    for i in range(2):
        sched.add_request(_req(f"old{i}", P2, i))
    step(sched)
    for i in range(2):
        sched.add_request(_req(f"p0-{i}", P0, 10 + i))
    step(sched)
    step(sched)
    assert {r.request_id for r in sched._waiting} == {"old0", "old1"}
    assert all(r.status is RequestStatus.PREEMPTED_RECOMPUTE for r in sched._waiting)
    return sched


def test_a_preempted_request_never_gives_way_and_the_429_says_why_it_counts() -> None:
    sched = _two_preempted_p2()
    # The queue holds two preempted P2 (at max_waiting already): a P1 cannot displace them.
    with pytest.raises(QueueFullError) as refused:
        sched.add_request(_req("p1", P1, 20))
    message = str(refused.value)
    # Not "2 requests are waiting (max_waiting=2)" as if nothing could be done: it says
    # that preempted requests fill it, and that they never give way.
    assert "2 of them preempted" in message and "max_waiting=2" in message
    sched.check_integrity()


def test_the_message_is_honest_when_preempted_requests_push_past_max_waiting() -> None:
    sched = _two_preempted_p2()
    sched.update_config(sched.config.with_overrides({"max_waiting": 1}))
    step(sched)
    with pytest.raises(QueueFullError) as refused:
        sched.add_request(_req("p2", P2, 30))
    message = str(refused.value)
    # 2 waiting against max_waiting=1 read as a contradiction: the preempted explain it.
    assert "2 requests wait" in message and "2 of them preempted" in message
    assert "max_waiting=1" in message and "never turned away" in message


def test_a_unit_of_choices_gives_way_whole_or_not_at_all() -> None:
    sched = _full([P2], max_waiting=3)
    # One HTTP request's two choices: admitted together, displaced together.
    pair = [_req("n-0", P2, 10), _req("n-1", P2, 11)]
    assert sched.add_requests(pair) == []
    displaced = sched.add_request(_req("urgent", P0, 50))
    assert sorted(r.request_id for r in displaced) == ["n-0", "n-1"]
    assert sorted(sched.requests) == ["running", "urgent", "w0-p2"]
    sched.check_integrity()


def test_a_unit_with_a_choice_started_never_gives_way() -> None:
    sched = make_scheduler(max_num_seqs=1, max_waiting=2)
    pair = [_req("n-0", P2, 10), _req("n-1", P2, 11)]
    sched.add_requests(pair)
    step(sched)  # one seq slot: the first choice starts, the second waits
    assert pair[0].status is RequestStatus.RUNNING and pair[1].status is RequestStatus.WAITING
    sched.add_request(_req("p0", P0, 20))
    # n-1 has not started, but its sibling has: its client has its status (a stream's
    # 200) or soon will, so it cannot be answered 429.
    with pytest.raises(QueueFullError):
        sched.add_request(_req("urgent", P0, 50))
    assert sorted(sched.requests) == ["n-0", "n-1", "p0"]
    sched.check_integrity()


def test_a_unit_is_admitted_all_or_none_and_displaces_nobody_for_nothing() -> None:
    sched = _full([P2, P0])
    # Two P0 choices need two places; only one P2 could give way: nobody is displaced.
    with pytest.raises(QueueFullError):
        sched.add_requests([_req("u-0", P0, 50), _req("u-1", P0, 51)])
    assert sorted(sched.requests) == ["running", "w0-p2", "w1-p0"]
    sched.check_integrity()


def test_the_engine_reports_the_displaced_and_observes_no_finish_for_them() -> None:
    finished: list[str] = []

    class Seen:
        def on_step(self, *args: object) -> None: ...
        def on_first_token(self, *args: object) -> None: ...
        def on_token_gap(self, *args: object) -> None: ...

        def on_finished(self, req: Request, now: float) -> None:
            finished.append(req.request_id)

    engine = make_engine(max_num_seqs=1, max_waiting=1)
    engine.observers.append(Seen())
    engine.add_request(_req("running", P2, 0))
    engine.step()
    engine.add_request(_req("batch", P2, 1))
    displaced = engine.add_request(_req("urgent", P0, 2))
    # A refusal, as one at the door: its caller answers it; it never finished.
    assert [r.request_id for r in displaced] == ["batch"] and finished == []
    engine.run_until_idle()
    assert sorted(finished) == ["running", "urgent"]
