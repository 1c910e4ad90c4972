"""Whether a trial was told failed, asked of its study at a bounded cost
(failed_trials.py): a yes kept, a no kept for a while, a read past its deadline a no."""

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


def test_a_read_past_its_deadline_is_a_no_and_its_answer_kept_when_it_comes() -> None:
    clock = [0.0]
    answers = FailedTrials(lambda: clock[0], not_failed_s=60.0, deadline_s=0.01)
    study = Study(True)
    study.held = threading.Event()
    assert not answers.failed("t", study.ask)  # the database holds the read
    assert not answers.failed("t", study.ask)  # kept: no second read, no wait
    clock[0] += 60.0
    assert not answers.failed("t", study.ask)  # the first read still under way
    assert study.asked == 1
    study.held.set()
    while not answers.failed("t", study.ask):  # its answer kept, once it comes
        continue
    assert study.asked == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        FailedTrials(deadline_s=0)


def test_with_every_worker_held_a_question_is_a_no_at_once() -> None:
    answers = FailedTrials(deadline_s=0.01, workers=1)
    held, other = Study(True), Study(True)
    held.held = threading.Event()
    assert not answers.failed("a", held.ask)
    assert not answers.failed("b", other.ask)
    assert other.asked == 0  # not asked: the one worker is held
    held.held.set()
