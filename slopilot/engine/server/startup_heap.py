"""Take the server's start-up heap out of the cyclic garbage collector's reach.

A serving process holds about 326,000 long-lived objects once torch, the model, the
tokenizer and the web stack are loaded, and every collection of the oldest generation
walks all of them: 166 ms on this project's CPU box, taken on whichever thread allocated
last, the engine's included. Under HTTP load that came once or twice every 40 s, a TBT
spike far above any class's SLO (P0's is 20 ms). ``gc.freeze`` moves what is alive now
into a permanent generation that collections skip; what the server allocates while it
serves is collected as before (longest pause 2.3 ms; ``benchmarks/gc_pause.py``). vLLM
freezes its heap after warm-up for the same reason.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class FrozenHeap:
    objects: int  # objects moved out of the collector's reach
    collect_ms: float  # the full collection before the freeze: what each one cost


def freeze_startup_heap() -> FrozenHeap:
    """Collect what start-up left behind (frozen garbage would never be collected), then
    freeze the rest. Call once, when the server is about to serve."""
    start = time.perf_counter()
    gc.collect()
    took = (time.perf_counter() - start) * 1e3
    gc.freeze()
    return FrozenHeap(gc.get_freeze_count(), took)
