"""Whether a trial was told failed, asked of its study at a bounded cost
(failed_trials.py): a yes kept, a no kept for a while, a read past its deadline not
known (the repair deferred) until its answer comes or a bound passes."""

from __future__ import annotations

import threading

import pytest

from slopilot.operator.failed_trials import FailedTrials


class Study:
    """A study that counts the questions asked of it; with ``held``, each waits for it."""

    def __init__(self, failed: bool) -> None:
        self.failed, self.asked = failed, 0
        self.held: threading.Event | None = None

    def ask(self) -> bool:
        self.asked += 1
        if self.held is not None:
            self.held.wait()
        return self.failed


def test_a_yes_is_kept_for_good() -> None:
    clock = [0.0]
    answers, study = FailedTrials(lambda: clock[0], not_failed_s=60.0), Study(True)
    assert answers.failed("t", study.ask, storage="db")
    clock[0] += 1e9
    assert answers.failed("t", study.ask, storage="db")
    assert study.asked == 1


def test_a_no_is_kept_for_its_while_then_asked_again() -> None:
    clock = [0.0]
    answers, study = FailedTrials(lambda: clock[0], not_failed_s=60.0), Study(False)
    assert not answers.failed("t", study.ask, storage="db")
    clock[0] += 59.0
    assert not answers.failed("t", study.ask, storage="db")
    assert study.asked == 1
    study.failed = True  # the trial told failed since
    clock[0] += 1.0
    assert answers.failed("t", study.ask, storage="db")
    assert study.asked == 2
    assert not answers.failed("other", Study(False).ask, storage="db")  # each trial its own


def test_a_read_that_raises_is_a_no() -> None:
    def down() -> bool:
        raise RuntimeError("the database went away")

    assert not FailedTrials().failed("t", down, storage="db")


def test_a_read_past_its_deadline_is_not_known_and_its_answer_kept_when_it_comes() -> None:
    """Not a no: the reconcile defers its repair (vllm_take_back.RenderDeferred) rather
    than render the trial's record, which a yes coming a moment later would have had
    rolled off the pods again."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    study = Study(True)
    study.held = threading.Event()
    assert answers.failed("t", study.ask, storage="db") is None  # the database holds the read
    assert answers.failed("t", study.ask, storage="db") is None  # no second read
    clock[0] += 29.0
    assert answers.failed("t", study.ask, storage="db") is None  # the first read still under way
    assert study.asked == 1
    study.held.set()
    while answers.failed("t", study.ask, storage="db") is None:  # its answer kept, once it comes
        continue
    assert answers.failed("t", study.ask, storage="db") is True
    assert study.asked == 1


def test_a_read_unanswered_past_its_bound_is_a_no_kept_for_its_while() -> None:
    """A storage that never answers defers a repair for ``unanswered_s`` at most: past
    it the question is a no (the record rendered, as with no stamp), kept as one."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    study = Study(True)
    study.held = threading.Event()
    assert answers.failed("t", study.ask, storage="db") is None
    clock[0] += 30.0
    assert answers.failed("t", study.ask, storage="db") is False
    clock[0] += 59.0
    assert answers.failed("t", study.ask, storage="db") is False  # kept: no wait, no second read
    assert study.asked == 1
    study.held.set()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        FailedTrials(deadline_s=0)
    with pytest.raises(ValueError, match="unanswered_s"):
        FailedTrials(unanswered_s=-1)


def test_with_every_worker_held_a_question_is_not_known_at_once() -> None:
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], deadline_s=0.01, workers=1, unanswered_s=30.0)
    held, other = Study(True), Study(True)
    held.held = threading.Event()
    assert answers.failed("a", held.ask, storage="a") is None
    assert answers.failed("b", other.ask, storage="b") is None
    assert other.asked == 0  # not asked: the one worker is held
    clock[0] += 30.0
    assert answers.failed("b", other.ask, storage="b") is False  # past the bound, a no
    assert other.asked == 0
    held.held.set()


class Hung:
    """A storage that holds every read until ``released``; with ``then_raise`` the read
    fails once released (a statement timeout), else it answers ``failed``."""

    def __init__(self, failed: bool = True, then_raise: bool = False) -> None:
        self.failed, self.then_raise, self.asked = failed, then_raise, 0
        self.released = threading.Event()

    def ask(self) -> bool:
        self.asked += 1
        self.released.wait()
        if self.then_raise:
            raise TimeoutError("canceling statement due to statement timeout")
        return self.failed


def test_a_storage_that_never_answers_defers_a_question_once_not_at_each_kept_no() -> None:
    """The bound counts from the first time the question went unanswered until a real
    answer comes: past it, the question is a no at each ask, its kept no's expiry
    starting no new deferral (nor a wait for the read again)."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    hung = Hung()
    try:
        seen = []
        for t in range(0, 400, 10):  # a drift repair or a spec retry every 10 s
            clock[0] = float(t)
            seen.append((t, answers.failed("t", hung.ask, storage="db")))
        assert [t for t, a in seen if a is None] == [0, 10, 20]
        assert all(a is False for t, a in seen if t >= 30)
        assert hung.asked == 1
    finally:
        hung.released.set()


def test_a_read_that_fails_past_its_deadline_starts_no_new_deferral() -> None:
    """A PostgreSQL server that holds each read until its statement timeout: the read's
    error after the deadline is a no (kept), not an answer in time, so the next read,
    held again, is not waited for nor deferred again."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    first, second = Hung(then_raise=True), Hung()
    try:
        assert answers.failed("t", first.ask, storage="db") is None
        clock[0] = 30.0
        assert answers.failed("t", first.ask, storage="db") is False
        first.released.set()  # the statement timeout
        while any(t.name == "failed-trials" for t in threading.enumerate()):
            continue
        clock[0] = 100.0  # the kept no expired: a new read, held
        assert answers.failed("t", second.ask, storage="db") is False
        assert second.asked == 1
        clock[0] = 110.0
        assert answers.failed("t", second.ask, storage="db") is False
        assert second.asked == 1
    finally:
        second.released.set()


def test_a_real_answer_ends_the_unanswered_mark() -> None:
    """Once the storage answers, the question is cached as any other: a later read held
    again is waited for and deferred again, within its own bound."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    hung = Hung(failed=False)
    assert answers.failed("t", hung.ask, storage="db") is None
    hung.released.set()
    while answers.failed("t", hung.ask, storage="db") is None:
        continue
    clock[0] = 60.0
    again = Hung()
    try:
        assert answers.failed("t", again.ask, storage="db") is None
        clock[0] = 89.0
        assert answers.failed("t", again.ask, storage="db") is None
        clock[0] = 90.0
        assert answers.failed("t", again.ask, storage="db") is False
    finally:
        again.released.set()


def test_a_hung_storage_holds_no_other_storage_s_reads() -> None:
    """Four CRs' reads held by tenant A's storage take at most its share of the workers:
    CR B's question, on a storage that answers, is read and answered, not deferred
    and then counted as no."""
    clock = [1000.0]
    answers = FailedTrials(lambda: clock[0], deadline_s=0.01, workers=4,
                           unanswered_s=30.0)
    hung = Hung()
    try:
        for i in range(4):
            assert answers.failed(f"a{i}", hung.ask, storage="postgresql://a") is None
        assert hung.asked == 1  # A's other questions not read behind the held one
        read = threading.Event()

        def healthy() -> bool:
            read.set()
            return True  # B's trial was told failed

        first = answers.failed("b", healthy, storage="postgresql://b")
        assert read.wait(60), "B's storage was not read"
        while first is None:  # a busy machine's read past the 0.01 s deadline
            first = answers.failed("b", healthy, storage="postgresql://b")
        assert first is True
        for t in range(1000, 1200, 10):
            clock[0] = float(t)
            assert answers.failed("b", healthy, storage="postgresql://b") is True
    finally:
        hung.released.set()


def test_a_question_waits_for_its_storage_s_read_under_way_not_deferred() -> None:
    """A storage's slot held by a read still within its deadline: a second question of
    the same storage waits for the slot and is read, not answered as unanswered."""
    answers = FailedTrials(deadline_s=3600.0, unanswered_s=30.0)
    slow, other = Hung(), Study(True)
    results: dict[str, bool | None] = {}
    first = threading.Thread(target=lambda: results.update(
        a=answers.failed("a", slow.ask, storage="db")))
    second = threading.Thread(target=lambda: results.update(
        b=answers.failed("b", other.ask, storage="db")))
    first.start()
    while slow.asked == 0:
        continue
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the slot, not answered None
    slow.released.set()
    first.join()
    second.join()
    assert results == {"a": True, "b": True}
    assert other.asked == 1
