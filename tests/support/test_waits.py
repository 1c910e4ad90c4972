"""The suite's poll helper on a fake clock: nothing here sleeps or reads the wall clock."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import waits
from tests.support.waits import (
    DEFAULT_HANG_GUARD_S,
    HANG_GUARD_ENV,
    WaitHung,
    hang_guard_s,
    wait_for,
)


class FakeTime:
    """A clock that moves only when slept on, or when a poll says it took a while."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture(autouse=True)
def guard(monkeypatch: pytest.MonkeyPatch) -> float:
    """A 10 s guard whatever the environment sets, so the poll counts below are exact."""
    monkeypatch.setattr(waits, "HANG_GUARD_S", 10.0)
    return 10.0


def answers(*values: object) -> Callable[[], object]:
    it: Iterator[object] = iter(values)
    return lambda: next(it)


def test_returns_the_first_truthy_value_without_sleeping(fake: FakeTime) -> None:
    got = wait_for(lambda: {"phase": "Running"}, "the status",
                   clock=fake.clock, sleep=fake.sleep)
    assert got == {"phase": "Running"}
    assert fake.slept == []


def test_polls_until_the_condition_holds_and_returns_its_value(fake: FakeTime) -> None:
    got = wait_for(answers(None, False, [], 0, "", {}, ["ready"]), "the pod",
                   interval_s=0.5, clock=fake.clock, sleep=fake.sleep)
    assert got == ["ready"]
    assert fake.slept == [0.5] * 6  # one sleep between each of the seven polls


def test_a_slow_but_progressing_condition_is_not_cut_short(fake: FakeTime) -> None:
    # What a per-call 15 s guess got wrong: each poll takes 1 s on a busy machine, and
    # the thing arrives at 9.4 s; under the guard, that is a pass.
    calls = []

    def slow() -> bool:
        calls.append(fake.now)
        fake.now += 1.0
        return len(calls) == 8

    assert wait_for(slow, "a slow answer", interval_s=0.2,
                    clock=fake.clock, sleep=fake.sleep) is True
    assert len(calls) == 8


def test_fails_at_the_guard_saying_what_polls_slowest_error_and_diagnosis(
        fake: FakeTime, guard: float) -> None:
    polls = 0

    def flaky() -> None:
        nonlocal polls
        polls += 1
        if polls == 1:
            fake.now += 3.0  # one slow poll
            raise TimeoutError("read timed out")
        return None

    with pytest.raises(WaitHung) as info:
        wait_for(flaky, "the Deployment chat", interval_s=1.0, tolerate=(TimeoutError,),
                 diagnose=lambda: "--- thread MainThread\n  in poll()",
                 clock=fake.clock, sleep=fake.sleep)
    message = str(info.value)
    # 3 s of the slow first poll, then 1 s per sleep: the 8th poll ends at 10 s.
    assert polls == 8
    assert "the Deployment chat" in message
    assert "8 polls" in message and "the slowest 3.0 s" in message
    assert "hang guard of 10 s" in message and HANG_GUARD_ENV in message
    assert "last tolerated error: TimeoutError: read timed out" in message
    assert message.endswith("--- thread MainThread\n  in poll()")
    assert isinstance(info.value, AssertionError)  # pytest reports it as a test failure


def test_the_guard_is_measured_from_the_start_not_per_poll(fake: FakeTime) -> None:
    with pytest.raises(WaitHung, match="5 polls"):
        wait_for(lambda: None, "never", interval_s=2.5, clock=fake.clock, sleep=fake.sleep)
    assert sum(fake.slept) == 10.0


def test_no_tolerated_error_says_so(fake: FakeTime) -> None:
    with pytest.raises(WaitHung, match="last tolerated error: none"):
        wait_for(lambda: False, "never", interval_s=5, clock=fake.clock, sleep=fake.sleep)


def test_a_failing_diagnosis_does_not_hide_the_wait(fake: FakeTime) -> None:
    def broken() -> str:
        raise RuntimeError("no frames")

    with pytest.raises(WaitHung) as info:
        wait_for(lambda: None, "the event", interval_s=5, diagnose=broken,
                 clock=fake.clock, sleep=fake.sleep)
    assert "the event" in str(info.value)
    assert "diagnose() failed: RuntimeError: no frames" in str(info.value)


def test_tolerated_errors_are_retried(fake: FakeTime) -> None:
    def boom() -> object:
        raise ConnectionError("refused")

    attempts = iter([boom, boom, lambda: "up"])
    got = wait_for(lambda: next(attempts)(), "the server", tolerate=(OSError,),
                   clock=fake.clock, sleep=fake.sleep)
    assert got == "up"
    assert len(fake.slept) == 2


def test_other_errors_propagate_at_once(fake: FakeTime) -> None:
    def broken() -> object:
        raise KeyError("spec")

    with pytest.raises(KeyError, match="spec"):
        wait_for(broken, "the spec", tolerate=(TimeoutError,),
                 clock=fake.clock, sleep=fake.sleep)
    assert fake.slept == []


def test_nothing_is_tolerated_unless_asked(fake: FakeTime) -> None:
    def timed_out() -> object:
        raise TimeoutError("read")

    with pytest.raises(TimeoutError):
        wait_for(timed_out, "a read", clock=fake.clock, sleep=fake.sleep)


@pytest.mark.parametrize(("raw", "expected"), [
    (None, DEFAULT_HANG_GUARD_S), ("", DEFAULT_HANG_GUARD_S), ("  ", DEFAULT_HANG_GUARD_S),
    ("90", 90.0), ("0.5", 0.5), (" 120 ", 120.0), ("1e2", 100.0)])
def test_the_guard_comes_from_the_environment(raw: str | None, expected: float) -> None:
    environ = {} if raw is None else {HANG_GUARD_ENV: raw}
    assert hang_guard_s(environ) == expected


def test_the_default_sits_under_pytest_timeouts_limit() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["tool"]["pytest"]["ini_options"]["timeout"] > DEFAULT_HANG_GUARD_S


@pytest.mark.parametrize("raw", ["0", "-5", "-0.1", "soon", "4m", "nan", "inf", "-inf"])
def test_a_bad_guard_is_refused_with_the_variable_the_value_and_the_fix(raw: str) -> None:
    with pytest.raises(ValueError) as info:
        hang_guard_s({HANG_GUARD_ENV: raw})
    message = str(info.value)
    assert HANG_GUARD_ENV in message
    assert repr(raw) in message
    assert "positive number of seconds" in message and "unset it" in message


def test_progress_rearms_the_guard_so_only_a_stalled_phase_fails(fake: FakeTime) -> None:
    # A loop that takes 25 s (past the 10 s guard) to get there, but shows a new step
    # every 6 s: each step re-arms the guard, so the wait is not cut short.
    def step() -> int:
        return int((fake.now - 1000.0) // 6)

    assert wait_for(lambda: fake.now - 1000.0 >= 25, "a progressing loop", interval_s=1.0,
                    progress=step, clock=fake.clock, sleep=fake.sleep) is True


def test_a_stall_after_progress_fails_one_guard_after_the_last_step(fake: FakeTime) -> None:
    # Steps until 12 s, then nothing: the guard runs from the last step seen.
    def step() -> int:
        return min(int((fake.now - 1000.0) // 6), 2)

    with pytest.raises(WaitHung,
                       match=r"a stalled loop; progress last seen 10.0 s ago, at 2 after"):
        wait_for(lambda: False, "a stalled loop", interval_s=1.0, progress=step,
                 clock=fake.clock, sleep=fake.sleep)
    assert fake.now - 1000.0 == 12 + 10  # the last step at 12 s, then one guard


def test_a_progress_value_that_never_changes_is_the_plain_guard(fake: FakeTime) -> None:
    with pytest.raises(WaitHung):
        wait_for(lambda: False, "no progress", interval_s=1.0, progress=lambda: 0,
                 clock=fake.clock, sleep=fake.sleep)
    assert fake.now - 1000.0 == 10
