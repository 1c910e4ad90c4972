"""The suite's one poll helper: a wait ends when its condition holds, not on a speed guess.

A per-call deadline (15 s here, 60 s there) is a guess about how fast the machine is: on
a busy 2-core CI box it runs out while the code under test is still making progress. So
no wait here has one. The only bound is a hang guard, one value for the whole suite,
there to turn a real hang into a failure that says what was awaited (and, through
``diagnose``, what the process was doing) before pytest-timeout's bare 300 s kill.

A wait over a loop of many steps (a controller's trials, each its own window) passes
``progress``: a value that changes whenever the loop takes a step. Each change re-arms
the guard, so a slow machine's long but moving episode is not cut short, and only a
phase that stalls for a whole guard fails. Such a test's own pytest timeout must cover
its steps (``progress_timeout_s``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, overload

T = TypeVar("T")

HANG_GUARD_ENV = "SLOPILOT_TEST_HANG_GUARD_S"
# Under pytest-timeout's 300 s per test (pyproject), so a hung wait fails with its own
# message first; far above any wait that is making progress, however busy the machine.
DEFAULT_HANG_GUARD_S = 240.0


class WaitHung(AssertionError):
    """A wait's condition did not hold within the suite's hang guard."""


def hang_guard_s(environ: Mapping[str, str] = os.environ) -> float:
    """The hang guard in seconds: ``SLOPILOT_TEST_HANG_GUARD_S`` or the default."""
    raw = environ.get(HANG_GUARD_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_HANG_GUARD_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{HANG_GUARD_ENV}={raw!r} is not a positive number of seconds: set it to one "
            f"(e.g. {HANG_GUARD_ENV}={DEFAULT_HANG_GUARD_S:g}, below pytest-timeout's "
            f"per-test limit) or unset it for the default")
    return value


HANG_GUARD_S = hang_guard_s()


@overload
def wait_for(condition: Callable[[], bool], what: str, *, interval_s: float = ...,
             tolerate: tuple[type[BaseException], ...] = ...,
             diagnose: Callable[[], str] | None = ...,
             progress: Callable[[], object] | None = ..., clock: Callable[[], float] = ...,
             sleep: Callable[[float], None] = ...) -> bool: ...


@overload
def wait_for(condition: Callable[[], T | bool | None], what: str, *, interval_s: float = ...,
             tolerate: tuple[type[BaseException], ...] = ...,
             diagnose: Callable[[], str] | None = ...,
             progress: Callable[[], object] | None = ..., clock: Callable[[], float] = ...,
             sleep: Callable[[float], None] = ...) -> T: ...


def wait_for(condition: Callable[[], object], what: str, *,
             interval_s: float = 0.05,
             tolerate: tuple[type[BaseException], ...] = (),
             diagnose: Callable[[], str] | None = None,
             progress: Callable[[], object] | None = None,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> object:
    """Poll ``condition()`` until it returns something truthy, and return that.

    An exception of a ``tolerate`` type counts as "not yet" (a read that timed out on a
    busy machine); any other propagates at once. Past ``HANG_GUARD_S`` it raises
    ``WaitHung`` naming ``what``, the polls made, the slowest one, the last tolerated
    error and whatever ``diagnose()`` returns. With ``progress``, the guard runs from the
    last poll at which ``progress()`` returned a new value, not from the first poll.
    """
    start = clock()
    polls, slowest, error = 0, 0.0, ""
    seen = progress() if progress is not None else None
    while True:
        t0 = clock()
        try:
            result = condition()
        except tolerate as exc:
            result, error = None, f"{type(exc).__name__}: {exc}"
        polls, slowest = polls + 1, max(slowest, clock() - t0)
        if result:
            return result
        if progress is not None and (now := progress()) != seen:
            seen, start = now, clock()  # a step taken: the guard runs from here
        if clock() - start >= HANG_GUARD_S:
            stalled = "" if progress is None else (
                f"; progress last seen {clock() - start:.1f} s ago, at {seen!r}")
            raise WaitHung(_message(what + stalled, polls, slowest, error, diagnose))
        sleep(interval_s)


def _message(what: str, polls: int, slowest: float, error: str,
             diagnose: Callable[[], str] | None) -> str:
    lines = [f"still waiting for {what} after the suite's hang guard of {HANG_GUARD_S:g} s "
             f"({HANG_GUARD_ENV}): {polls} polls, the slowest {slowest:.1f} s",
             f"last tolerated error: {error or 'none'}"]
    if diagnose is not None:
        try:
            lines.append(diagnose())
        except Exception as exc:  # the wait's own failure must not be lost to this one
            lines.append(f"diagnose() failed: {type(exc).__name__}: {exc}")
    return "\n".join(lines)


def progress_timeout_s(steps: int, *, step_guard_s: float | None = None) -> float:
    """A pytest timeout for a test whose waits re-arm on progress: a guard per step,
    ``steps`` the most the test can take (its waits plus the loop's bounded steps), and
    one guard of slack for setup and teardown."""
    guard = HANG_GUARD_S if step_guard_s is None else step_guard_s
    return guard * (steps + 1)
