"""The argparse type of the commands' seconds flags (``--duration``, ``--warmup``, ...):
a number of seconds, or a duration as a custom resource writes it.

A CR writes ``5m``; the same user typing ``--duration 5m`` got argparse's bare "invalid
float value: '5m'", which named neither seconds nor the form it wanted. The flag's range
(above 0, at least 0) is judged where the command judges it, after this.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from slopilot.engine.durations import parse_duration


def seconds(flag: str) -> Callable[[str], float]:
    """argparse type: ``300``, ``2.5``, ``5m``, ``90s``, ``1h30m`` or ``250ms``, in seconds."""
    def parse(text: str) -> float:
        try:
            return float(text)  # nan, inf and 0 too: the command names its range
        except ValueError:
            pass
        try:
            return parse_duration(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text}: expected seconds (e.g. 300) or a duration such as 90s, 5m "
                "or 1h30m") from None
    return parse
