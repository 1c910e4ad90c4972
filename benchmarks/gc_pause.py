"""Garbage-collector pauses in a serving process, with and without the start-up freeze.

``slopilot serve`` freezes its start-up heap (``engine/server/startup_heap.py``) so that
collections while it serves skip the model, the tokenizer and the web stack. This
script builds the same process state (the torch backend and the app, as ``serve`` does)
and measures, side by side in one run:

- a full collection (``gc.collect()``, what each oldest-generation collection costs):
  the median of ``--repeats``, before the freeze and after it;
- the collections the engine triggers itself while it serves ``--requests`` requests
  (each generation's count and longest pause, from ``gc.callbacks``), before and after.

    .venv/bin/python benchmarks/gc_pause.py [--model smollm2-135m] [--requests 48]

Ends with ``RESULT objects=... full_collect_ms=... frozen_full_collect_ms=...
speedup_full_collect=... serve_max_pause_ms=... frozen_serve_max_pause_ms=...``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.request import Request, SamplingParams
from slopilot.engine.server.app import create_app
from slopilot.engine.server.backends import build_torch
from slopilot.engine.server.startup_heap import freeze_startup_heap


class Pauses:
    """Every collection's generation and pause while installed in ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seen.append((info["generation"], time.perf_counter() - self._start))

    def summary(self) -> dict[int, tuple[int, float]]:
        out: dict[int, tuple[int, float]] = {}
        for gen in (0, 1, 2):
            pauses = [p for g, p in self.seen if g == gen]
            out[gen] = (len(pauses), max(pauses, default=0.0) * 1e3)
        return out


def full_collect_ms(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def serve(engine: Any, n: int, max_tokens: int, seed: int) -> Pauses:
    """``n`` requests of 16-128 prompt tokens through the engine loop, collections timed."""
    rng = random.Random(seed)
    pauses = Pauses()
    gc.callbacks.append(pauses)
    try:
        for i in range(n):
            prompt = [3 + rng.randrange(1000) for _ in range(rng.randint(16, 128))]
            engine.add_request(Request(f"gc{seed}-{i}", prompt, SamplingParams(
                max_tokens=max_tokens, ignore_eos=True)))
        engine.run_until_idle()
    finally:
        gc.callbacks.remove(pauses)
    return pauses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    backend = build_torch(EngineConfig(), args.model)
    create_app(backend)  # the web stack's objects, as a server holds them
    engine = backend.engine
    gc.collect()
    objects = len(gc.get_objects())
    before = full_collect_ms(args.repeats)
    loose = serve(engine, args.requests, args.max_tokens, seed=0).summary()
    heap = freeze_startup_heap()
    after = full_collect_ms(args.repeats)
    frozen = serve(engine, args.requests, args.max_tokens, seed=1).summary()
    for name, s in (("as started", loose), ("frozen", frozen)):
        print(f"serving {args.requests} requests, {name}: " + "; ".join(
            f"gen{g} {n} collections, longest {ms:.1f} ms" for g, (n, ms) in s.items()))
    print(f"{objects} tracked objects ({heap.objects} frozen); a full collection "
          f"{before:.1f} ms before the freeze, {after:.2f} ms after")
    serve_max = max(ms for _, ms in loose.values())
    frozen_max = max(ms for _, ms in frozen.values())
    speedup = before / max(after, 1e-3)
    print(f"RESULT objects={objects} full_collect_ms={before:.1f} "
          f"frozen_full_collect_ms={after:.3f} speedup_full_collect={speedup:.0f} "
          f"serve_max_pause_ms={serve_max:.1f} frozen_serve_max_pause_ms={frozen_max:.1f} "
          f"serve_gen2={loose[2][0]} frozen_serve_gen2={frozen[2][0]}")
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
