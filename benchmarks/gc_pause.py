"""Garbage-collector pauses in a serving process, with and without the start-up freeze.

``slopilot serve`` freezes its start-up heap (``engine/server/startup_heap.py``) so that
collections while it serves skip the model, the tokenizer and the web stack. This
script builds the same process (the torch backend and the server, as ``serve`` does,
here on a thread) and measures, side by side in one run:

- a full collection (``gc.collect()``, what each oldest-generation collection costs):
  the median of ``--repeats``, before the freeze and after it;
- the collections the server triggers itself while another process loads it over HTTP
  for ``--seconds`` (16 clients, streamed and not; each generation's count and longest
  pause, from ``gc.callbacks``): first as started, then frozen.

    .venv/bin/python benchmarks/gc_pause.py [--model tiny-random] [--seconds 40]

Ends with ``RESULT objects=... full_collect_ms=... frozen_full_collect_ms=...
speedup_full_collect=... max_pause_ms=... frozen_max_pause_ms=... gen2=... frozen_gen2=...``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from typing import Any

from slopilot.engine.config import EngineConfig
from slopilot.engine.server.backends import build_torch
from slopilot.engine.server.startup_heap import freeze_startup_heap
from slopilot.engine.server.uvicorn_runner import make_server, run_in_thread

# The load: its own process, so its objects are not the server's to collect.
CLIENT = r"""
import concurrent.futures, sys, time
import httpx
url, end = sys.argv[1], time.monotonic() + float(sys.argv[2])
def client(i):
    done = 0
    with httpx.Client(timeout=120) as c:
        while time.monotonic() < end:
            c.post(url + "/v1/completions", json={"prompt": "hello world " * 20,
                   "max_tokens": 16, "stream": i % 2 == 0, "ignore_eos": True})
            done += 1
    return done
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    print(sum(pool.map(client, range(16))))
"""


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

    def count(self, gen: int) -> int:
        return sum(1 for g, _ in self.seen if g == gen)

    def longest_ms(self, gen: int | None = None) -> float:
        return max((p for g, p in self.seen if gen is None or g == gen), default=0.0) * 1e3

    def line(self) -> str:
        return "; ".join(f"gen{g} {self.count(g)} collections, longest "
                         f"{self.longest_ms(g):.1f} ms" for g in (0, 1, 2))


def full_collect_ms(repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def load(url: str, seconds: float) -> tuple[int, Pauses]:
    """Requests the client process got answered, and the server's collections meanwhile."""
    pauses = Pauses()
    gc.callbacks.append(pauses)
    try:
        out = subprocess.run([sys.executable, "-c", CLIENT, url, str(seconds)],
                             capture_output=True, text=True, check=True)
    finally:
        gc.callbacks.remove(pauses)
    return int(out.stdout.strip()), pauses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    backend = build_torch(EngineConfig(), args.model)
    server = make_server(backend, port=0)
    run_in_thread(server)
    url = f"http://127.0.0.1:{server.bound_port}"
    try:
        gc.collect()
        objects = len(gc.get_objects())
        before = full_collect_ms(args.repeats)
        served, loose = load(url, args.seconds)
        heap = freeze_startup_heap()
        after = full_collect_ms(args.repeats)
        served_frozen, frozen = load(url, args.seconds)
    finally:
        server.should_exit = True
    print(f"as started, {served} requests in {args.seconds:g} s: {loose.line()}")
    print(f"frozen, {served_frozen} requests in {args.seconds:g} s: {frozen.line()}")
    print(f"{objects} tracked objects ({heap.objects} frozen); a full collection "
          f"{before:.1f} ms before the freeze, {after:.2f} ms after")
    speedup = before / max(after, 1e-3)
    print(f"RESULT objects={objects} full_collect_ms={before:.1f} "
          f"frozen_full_collect_ms={after:.3f} speedup_full_collect={speedup:.0f} "
          f"max_pause_ms={loose.longest_ms():.1f} "
          f"frozen_max_pause_ms={frozen.longest_ms():.1f} "
          f"gen2={loose.count(2)} frozen_gen2={frozen.count(2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
