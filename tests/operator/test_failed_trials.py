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
    assert answers.failed("t", study.ask)
    clock[0] += 1e9
    assert answers.failed("t", study.ask)
    assert study.asked == 1


def test_a_no_is_kept_for_its_while_then_asked_again() -> None:
    clock = [0.0]
    answers, study = FailedTrials(lambda: clock[0], not_failed_s=60.0), Study(False)
    assert not answers.failed("t", study.ask)
    clock[0] += 59.0
    assert not answers.failed("t", study.ask)
    assert study.asked == 1
    study.failed = True  # the trial told failed since
    clock[0] += 1.0
    assert answers.failed("t", study.ask)
    assert study.asked == 2
    assert not answers.failed("other", Study(False).ask)  # each trial its own


def test_a_read_that_raises_is_a_no() -> None:
    def down() -> bool:
        raise RuntimeError("the database went away")

    assert not FailedTrials().failed("t", down)


def test_a_read_past_its_deadline_is_not_known_and_its_answer_kept_when_it_comes() -> None:
    """Not a no: the reconcile defers its repair (vllm_take_back.RenderDeferred) rather
    than render the trial's record, which a yes coming a moment later would have had
    rolled off the pods again."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    study = Study(True)
    study.held = threading.Event()
    assert answers.failed("t", study.ask) is None  # the database holds the read
    assert answers.failed("t", study.ask) is None  # no second read
    clock[0] += 29.0
    assert answers.failed("t", study.ask) is None  # the first read still under way
    assert study.asked == 1
    study.held.set()
    while answers.failed("t", study.ask) is None:  # its answer kept, once it comes
        continue
    assert answers.failed("t", study.ask) is True
    assert study.asked == 1


def test_a_read_unanswered_past_its_bound_is_a_no_kept_for_its_while() -> None:
    """A storage that never answers defers a repair for ``unanswered_s`` at most: past
    it the question is a no (the record rendered, as with no stamp), kept as one."""
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01,
                           unanswered_s=30.0)
    study = Study(True)
    study.held = threading.Event()
    assert answers.failed("t", study.ask) is None
    clock[0] += 30.0
    assert answers.failed("t", study.ask) is False
    clock[0] += 59.0
    assert answers.failed("t", study.ask) is False  # kept: no wait, no second read
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
    assert answers.failed("a", held.ask) is None
    assert answers.failed("b", other.ask) is None
    assert other.asked == 0  # not asked: the one worker is held
    clock[0] += 30.0
    assert answers.failed("b", other.ask) is False  # past the bound, a no
    assert other.asked == 0
    held.held.set()
