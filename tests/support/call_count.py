"""The function calls a piece of code makes: its CPU work, counted where a time would
read the machine's load (a render on an event loop, say, which every stream waits for)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def calls(fn: Callable[[], object]) -> int:
    """Python and C function calls made by ``fn()`` (on this thread)."""
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count
