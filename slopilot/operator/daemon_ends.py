"""``DaemonEnds``: the LLMDeployments a tuning daemon of this process still runs for,
its end included, so that the deletion handler never deletes a study beside it.

A deleted CR's study is deleted by its daemon's end (``DeploymentLoop.end_deleted``:
the running trial failed, then the study deleted), and by the deletion handler where no
daemon ends with it: tuning off, or the CR deleted while no operator ran (kopf starts no
daemon for a CR already Terminating, so the next start's handler is the only one). The
handler waits for this process's daemon of the CR, if any, to end before it deletes:
beside a daemon's end it deleted the study under the trial the end fails, and beside a
daemon's step under the trial it measures. After a daemon's end the deletion is done
once more, a no-op where the end deleted the study (a deletion is by uid-keyed name,
and a study not there is no error), the deletion where the daemon ended without it
(the operator pausing, tuning turned off first).

Used from one event loop (kopf's), without a lock.
"""

from __future__ import annotations

import asyncio


class DaemonEnds:
    """Which CRs (by uid) have a daemon of this process running or ending."""

    def __init__(self) -> None:
        self._ends: dict[str, list[asyncio.Future[None]]] = {}

    def started(self, uid: str) -> asyncio.Future[None]:
        """A daemon of ``uid`` begins; the future it resolves (``ended``) once its end,
        trial and study included, is over."""
        end: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ends.setdefault(uid, []).append(end)
        return end

    def ended(self, uid: str, end: asyncio.Future[None]) -> None:
        """The daemon whose ``started`` gave ``end`` has ended, its end done."""
        if not end.done():
            end.set_result(None)
        left = [e for e in self._ends.get(uid, ()) if e is not end]
        if left:
            self._ends[uid] = left
        else:
            self._ends.pop(uid, None)

    async def wait(self, uid: str, timeout: float) -> bool:
        """Whether every daemon of ``uid`` has ended within ``timeout`` seconds (at once
        where none runs). Waiting cancels nothing: a caller cancelled leaves them be."""
        ends = list(self._ends.get(uid, ()))
        if not ends:
            return True
        _, pending = await asyncio.wait(ends, timeout=timeout)
        return not pending

    def __len__(self) -> int:
        """How many CRs have a daemon running or ending now."""
        return len(self._ends)
