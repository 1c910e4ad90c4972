"""A stop (Ctrl-C, SIGTERM) held while a trial is half made or half recorded.

Optuna's ``Study.ask`` makes the trial in storage before it returns it, and a tell is
several writes: a KeyboardInterrupt between them left the trial RUNNING in a stored
study (not yet held by the tuner, or no longer), until the heartbeat's grace period
failed it. A process that stops on a signal (``slopilot tune``) installs handlers that
call ``raise_or_hold``; ``Tuner`` does its bookkeeping inside ``whole()``, at whose end a
held stop is raised, where the trial can be told failed or is complete. Only the main
thread runs Python's signal handlers: elsewhere (the operator's controller threads)
``whole()`` holds nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0
"""How many ``whole()`` blocks the main thread is in."""
_held: list[BaseException] = []


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def whole() -> Iterator[None]:
    """A block of study writes a stop must not cut in two: a stop that
    ``raise_or_hold`` was given meanwhile is raised when it ends."""
    global _depth
    if not _main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _held:
            stop = _held[0]
            _held.clear()
            raise stop


def raise_or_hold(stop: BaseException) -> None:
    """For a signal handler: raise ``stop`` now, or, inside ``whole()``, at its end."""
    if _depth > 0 and _main_thread():
        if not _held:  # a second Ctrl-C while held is the same stop
            _held.append(stop)
        return
    raise stop
