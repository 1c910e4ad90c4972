"""The waiting queue: requests not running, served by class, then arrival.

A heap of ``(priority, arrival_time, seq_no, request)``. ``arrival_time`` (the moment
the request reached the server) orders a class, so a prompt that took long to tokenize
keeps its place against one that arrived later but was ready sooner; ``seq_no`` breaks
ties and is unique, so the request itself is never compared. A preempted request keeps
both and so returns at the front of its class.

An aborted request leaves at once: nothing it holds (prompt, outputs) outlives the abort,
and the heap never holds more than ``max_waiting`` plus the preempted.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from slopilot.engine.request import Request

_Entry = tuple[int, float, int, Request]


class WaitingQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, req.seq_no, req))

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        """Take ``req`` out wherever it is (an abort); O(n), and n is bounded."""
        heap = self._heap
        # Tuple equality stops at seq_no (unique), so this never compares requests.
        i = heap.index((req.priority, req.arrival_time, req.seq_no, req))
        last = heap.pop()
        if i < len(heap):
            heap[i] = last
            heapq.heapify(heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in no particular order (tests, integrity checks)."""
        return (entry[3] for entry in self._heap)
