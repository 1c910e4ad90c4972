"""The seconds flags of simulate, tune and demo read a number of seconds or a duration."""

from __future__ import annotations

import argparse

import pytest

from slopilot.cli import build_parser
from slopilot.engine.seconds_flag import seconds


@pytest.mark.parametrize(("text", "value"), [
    ("300", 300.0), ("2.5", 2.5), ("0", 0.0), ("-3", -3.0),  # a range is judged later
    ("5m", 300.0), ("90s", 90.0), ("1h30m", 5400.0), ("250ms", 0.25)])
def test_a_number_or_a_duration(text: str, value: float) -> None:
    assert seconds("--duration")(text) == value


@pytest.mark.parametrize("text", ["5 minutes", "5min", "m5", "", "1e400x", "nan s"])
def test_anything_else_names_the_flag_and_both_forms(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        seconds("--duration")(text)
    said = str(caught.value)
    assert said.startswith(f"--duration {text}: ")
    assert "e.g. 300" in said and "5m" in said


@pytest.mark.parametrize("argv", [
    ["simulate", "--duration", "5m"],
    ["tune", "--duration", "5m"],
    ["demo", "--duration", "5m"]])
def test_the_commands_take_a_duration(argv: list[str]) -> None:
    # A CR writes durations as 5m; `--duration 5m` was argparse's bare
    # "invalid float value: '5m'", which said nothing of seconds.
    assert build_parser().parse_args(argv).duration == 300.0


def test_tune_warmup_takes_a_duration() -> None:
    assert build_parser().parse_args(["tune", "--warmup", "1m"]).warmup == 60.0
