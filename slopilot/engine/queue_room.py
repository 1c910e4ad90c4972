"""Room in a full waiting queue: who gives way to a more urgent newcomer, and the 429s.

A full queue (``max_waiting``) refused every class alike, so a batch client retrying its
429s kept it full and locked every realtime (P0) request out, each refusal a P0 miss
that set off P0's alerts and retuned or scaled the deployment for load that was P2's.
Now a newcomer is refused only where no less urgent request can make room. Where one
can, the newest request of the least urgent class below the newcomer's that has not
started (never scheduled: no KV, no token given) is displaced: its client is answered a
429 with Retry-After as a refusal of its own class, as if it had come last (it had, of
its class), and the newcomer is admitted. Displacing swaps one request for another, so
the queue holds no more than before.

Never displaced:

- a request of the newcomer's class or a more urgent one: within a class, first come
  first served;
- a preempted request: its client has tokens already (a stream its 200 and its first
  chunks), so it cannot be refused any more, and its work would be thrown away;
- a choice of an HTTP request (its choices are one *unit*, admitted together) whose
  other choices have started, or ended: the client's answer is one status for all of
  them. A unit whose choices have none of them started gives way whole.

Newest first within a class, as preemption picks its victims: the request served last
is the one whose client loses least by retrying.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from slopilot.engine.request import Priority, Request, RequestStatus
from slopilot.engine.waiting_queue import WaitingQueue


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_waiting`` and nobody in it could give way; the
    server answers 429."""


class DisplacedError(QueueFullError):
    """A queued request that had not started gave way to a more urgent one in a full
    queue: refused for load as at the door (429, counted in its own class)."""


def room_for(reqs: Sequence[Request], waiting: WaitingQueue,
             units: Mapping[str, tuple[Request, ...]], max_waiting: int) -> list[Request]:
    """Who gives way so that ``reqs`` (one unit) fit within ``max_waiting``; raises
    QueueFullError where nobody can. At most as many as they are: where preempted
    requests hold the queue past ``max_waiting``, a newcomer swaps places with a less
    urgent one, it does not empty the queue."""
    short = min(len(reqs), len(waiting) + len(reqs) - max_waiting)
    if short <= 0:
        return []
    # The least urgent of them: whoever gives way to it gives way to each.
    cls = max(r.priority for r in reqs)
    displaced = None
    if waiting.num_fresh_below(cls) >= short:  # else none could: O(1) for a same-class storm
        displaced = choose_displaced(waiting, units, cls, short)
    if displaced is None:
        raise QueueFullError(queue_full_message(len(waiting), waiting.num_preempted,
                                                max_waiting, cls))
    return displaced


def _rank(req: Request) -> tuple[int, float, int]:
    return (req.priority, req.arrival_time, req.seq_no)


def choose_displaced(waiting: Iterable[Request], units: Mapping[str, tuple[Request, ...]],
                     cls: Priority, short: int) -> list[Request] | None:
    """The waiting requests to displace so that ``short`` more requests of class ``cls``
    fit: whole units of requests that have not started, of classes below ``cls``, the
    least urgent class first, the newest first within it. None where they cannot make
    that much room: then nobody is displaced for nothing.

    ``units``: request id to its unit, for requests admitted with others (one HTTP
    request's choices); a request absent from it is a unit of its own. O(n log n) in the
    waiting requests: called only with a full queue and a less urgent one waiting in it
    (``WaitingQueue.num_fresh_below``), once per newcomer let in.
    """
    # Reverse rank order: the least urgent class first, its newest request first.
    candidates = sorted((r for r in waiting
                         if r.priority > cls and r.status is RequestStatus.WAITING),
                        key=_rank, reverse=True)
    chosen: list[Request] = []
    taken: set[str] = set()
    for req in candidates:
        if req.request_id in taken:
            continue
        unit = units.get(req.request_id, (req,))
        taken.update(r.request_id for r in unit)
        if any(r.status is not RequestStatus.WAITING for r in unit):
            continue  # a sibling started (or ended): its client's status is decided
        chosen.extend(unit)
        if len(chosen) >= short:
            return chosen
    return None


def queue_full_message(num_waiting: int, num_preempted: int, max_waiting: int,
                       cls: Priority) -> str:
    """A 429's text where nobody could give way: how full the queue is, honestly.

    Preempted requests count towards ``max_waiting`` but are never turned away, so they
    may hold the queue past it: "31 requests are waiting (max_waiting=24)" read as a
    contradiction."""
    wait = "1 request waits" if num_waiting == 1 else f"{num_waiting} requests wait"
    if num_preempted:
        held = (f"{wait}, {num_preempted} of them preempted after "
                "they started (those count, and are never turned away, so they may hold "
                f"it past max_waiting={max_waiting})")
    else:
        held = f"{wait} (max_waiting={max_waiting})"
    below = "" if cls is Priority.P2 else (
        f"; none of a class below {cls.label} waits unstarted to give way to it")
    return f"the waiting queue is full: {held}{below}; retry later"


def displaced_message(victim: Priority, by: Priority, max_waiting: int) -> str:
    """A displaced request's 429 text."""
    return (f"the waiting queue is full (max_waiting={max_waiting}) and this "
            f"{victim.label} request, not yet started, gave way to a more urgent "
            f"{by.label} one; retry later")
