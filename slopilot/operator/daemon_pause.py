"""The tuning daemon's pause between ticks."""
from __future__ import annotations

import asyncio

import kopf

# How soon a stop is noticed. The pause looks at the flag this often rather than awaiting
# ``stopped.wait(n)``: that runs its timer in a task of its own, and when kopf cancels the
# daemon just as the timer runs out, the task ends in a TimeoutError that nobody awaits and
# that kopf re-raises at exit, failing a clean shutdown.
STOP_CHECK_S = 0.05


async def pause(stopped: kopf.DaemonStopped, seconds: float) -> None:
    """Sleep ``seconds``, or less if the daemon is told to stop; cancellable at any point."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopped:
        left = deadline - loop.time()
        if left <= 0:
            return
        await asyncio.sleep(min(STOP_CHECK_S, left))
