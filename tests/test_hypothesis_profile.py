"""The suite's hypothesis profile (tests/conftest.py): an example's wall-clock time, which
a busy machine stretches at will, fails no property test."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def test_an_example_that_a_busy_machine_stalls_fails_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # hypothesis times examples on time.perf_counter: each body here takes a second of
    # it, as a microsecond body does when the machine takes it off the CPU that long.
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    bodies: list[int] = []

    @given(st.integers())
    def stalled(x: int) -> None:
        bodies.append(x)
        now[0] += 1.0

    stalled()
    assert len(bodies) >= settings.default.max_examples


def test_the_same_examples_every_run() -> None:
    """A seed that changed every run made a failing example one run's and not the next's."""
    def examples() -> list[int]:
        seen: list[int] = []

        @given(st.integers())
        def record(x: int) -> None:
            seen.append(x)

        record()
        return seen

    assert examples() == examples()
