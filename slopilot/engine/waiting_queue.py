"""The waiting queue: requests not running, served by class, then arrival.

A heap of ``(priority, arrival_time, seq_no, request)``. ``arrival_time`` (the moment
the request reached the server) orders a class, so a prompt that took long to tokenize
keeps its place against one that arrived later but was ready sooner; ``seq_no`` breaks
ties and is unique, so the request itself is never compared. A preempted request keeps
both and so returns at the front of its class.

An aborted request leaves at once: nothing it holds (prompt, outputs) outlives the abort.
The heap holds at most ``max_waiting`` requests that have not started, plus the
preempted: those are never turned away (their clients have tokens already), so with them
it may hold more than ``max_waiting``. It counts the ones that have not started by class,
so that a full queue tells in O(1) whether a less urgent one could give way to a newcomer
(``queue_room.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from slopilot.engine.request import Priority, Request

_Entry = tuple[int, float, int, Request]


def _fresh(req: Request) -> bool:
    # In the queue, never preempted means never started: a request leaves the queue to
    # run and comes back only through a preemption, which counts it before the push.
    # Fixed from push to pop, unlike the status (admission sets RUNNING before the pop).
    return not req.num_preemptions


class WaitingQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._fresh_by_class = [0 for _ in Priority]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    @property
    def num_preempted(self) -> int:
        """Requests waiting to resume after a preemption."""
        return len(self._heap) - sum(self._fresh_by_class)

    def num_fresh_below(self, cls: Priority) -> int:
        """Requests of classes less urgent than ``cls`` that have not started."""
        return sum(self._fresh_by_class[cls + 1:])

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.seq_no, req))
        if _fresh(req):
            self._fresh_by_class[req.priority] += 1

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        req = heapq.heappop(self._heap)[3]
        if _fresh(req):
            self._fresh_by_class[req.priority] -= 1
        return req

    def remove(self, req: Request) -> None:
        """Take ``req`` out wherever it is (an abort); O(n), and n is bounded."""
        heap = self._heap
        # Tuple equality stops at seq_no (unique), so this never compares requests.
        i = heap.index((req.priority, req.arrival_time, req.seq_no, req))
        last = heap.pop()
        if i < len(heap):
            heap[i] = last
            heapq.heapify(heap)
        if _fresh(req):
            self._fresh_by_class[req.priority] -= 1

    def __iter__(self) -> Iterator[Request]:
        """Requests in no particular order (tests, integrity checks)."""
        return (entry[3] for entry in self._heap)
