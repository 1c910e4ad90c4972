"""``slopilot tune`` stopped by Ctrl-C or SIGTERM: what it found so far, and how to go on.

Ctrl-C raises KeyboardInterrupt wherever the study is, and ``Tuner.run`` tells the open
trial failed on its way out; SIGTERM (a supervisor, ``timeout``, ``kill``) killed the
process outright and left its trial RUNNING in a stored study until the heartbeat's
grace period failed it. Here SIGTERM raises ``Terminated`` the same way, and either is
held while a trial is half made or half recorded (``study/held_stops.py``), so both
leave the study consistent; both say the best trial so far (not a verdict: the start
config and the capacity search are not weighed) and, for a stored study, the command
that resumes it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from optuna.trial import TrialState

from slopilot.tuner.study.held_stops import raise_or_hold
from slopilot.tuner.study.tuner import Tuner
from slopilot.tuner.study.verdict import replicas_text
from slopilot.tuner.tune.settings import TuneSettings, check_command, tune_command

EXIT_INTERRUPTED = 130
"""128 + SIGINT, the shell's code for a command Ctrl-C stopped."""
EXIT_TERMINATED = 143
"""128 + SIGTERM."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as KeyboardInterrupt is for Ctrl-C (a
    BaseException for the same reason: no ``except Exception`` swallows it)."""

    def __str__(self) -> str:
        return "SIGTERM"


@contextmanager
def stops_raise() -> Iterator[None]:
    """While in the block, Ctrl-C raises KeyboardInterrupt and SIGTERM ``Terminated``,
    each held while the study's bookkeeping is half done (``study/held_stops.py``); the
    previous handlers are put back after. The main thread only: Python runs signal
    handlers there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        raise_or_hold(KeyboardInterrupt())

    def _terminate(signum: int, frame: FrameType | None) -> None:
        raise_or_hold(Terminated())

    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGINT, _interrupt), (signal.SIGTERM, _terminate))}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stopped_note(stop: BaseException, s: TuneSettings, tuner: Tuner, *, first: int,
                 start_done: bool) -> str:
    """What a stopped study says on stderr. ``first``: the study's trial count before
    this run (its trials are numbered from there); ``start_done``: whether the start
    config was evaluated."""
    how = "stopped by SIGTERM" if isinstance(stop, Terminated) else "interrupted (Ctrl-C)"
    best = tuner.best_trial()
    lines = [f"slopilot tune: {how} {_where(stop, tuner, first, start_done, best)}"]
    if best is not None:
        n, r = best
        on = f"on {replicas_text(s.replicas)}"
        holds = ("holds the SLO in every window with " f"{r.margin:.0%} headroom {on}"
                 if r.feasible else f"misses the SLO {on}")
        lines += [f"best so far: trial {n} (mean goodput {r.goodput_tok_s:,.1f} tok/s; {holds}), "
                  "not a verdict: neither compared with the start config nor a replica "
                  "count searched",
                  f"check it on the whole workload: {check_command(s, r.config, s.replicas)}"]
    if s.storage is not None:
        lines.append(f"resume the study with the same command: {tune_command(s)}")
    return "\n".join(lines)


def _where(stop: BaseException, tuner: Tuner, first: int, start_done: bool,
           best: object) -> str:
    """During which trial it stopped (the one it told failed), or after which."""
    told = f"{type(stop).__name__}:"
    mine = [t for t in tuner.study.get_trials(deepcopy=False) if t.number >= first]
    for t in reversed(mine):
        if t.state == TrialState.FAIL and \
                str(t.user_attrs.get("fail_reason", "")).startswith(told):
            return f"during trial {t.number}"
    if not start_done:
        return "on the start config" + ("" if best is not None else
                                        ", before any trial completed")
    done = [t.number for t in mine if t.state == TrialState.COMPLETE]
    if done:
        return f"after trial {done[-1]}"
    return "between trials" if best is not None else "before any trial completed"
