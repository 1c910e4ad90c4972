"""Open-loop Poisson load on live replicas, for the demo and the live-loop tests.

One thread runs an asyncio loop that posts ``/v1/completions`` to the replicas round
robin (the list is read again at each send, so new replicas get traffic) with bounded
concurrency. Arrivals, prompt and output lengths and classes come from one seeded RNG.
A prompt of N words is N tokens on the simulated executor (its placeholder tokenizer).
``set_phase`` changes the mix while it runs: the demo's shift and the tests' overload.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Phase:
    rate: float
    """Requests per second (Poisson)."""
    prompt_mean: float = 512.0
    output_mean: float = 64.0
    classes: Mapping[str, float] = field(
        default_factory=lambda: {"p0": 0.1, "p1": 0.7, "p2": 0.2})
    sigma: float = 0.7
    prompt_max: int = 4096

    def __post_init__(self) -> None:
        if not self.rate > 0 or not self.prompt_mean >= 1 or not self.output_mean >= 1:
            raise ValueError(f"phase {self}: rate, prompt_mean and output_mean must be > 0")
        if not self.classes or any(w < 0 for w in self.classes.values()):
            raise ValueError(f"classes={dict(self.classes)!r}: expected weights >= 0")


def _lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    mu = math.log(mean) - sigma * sigma / 2  # so that the arithmetic mean is ``mean``
    return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))


class LoadGenerator:
    def __init__(self, endpoints: Callable[[], list[str]], phase: Phase, *, model: str,
                 seed: int = 0, max_concurrency: int = 64, timeout_s: float = 60.0) -> None:
        self.endpoints, self.model = endpoints, model
        self.phase = phase
        self.rng = random.Random(seed)
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        self.sent = self.ok = self.failed = self.dropped = self.cancelled = 0
        """Every request sent is one of ok, failed, dropped (the client was full) or
        cancelled (still running when the load stopped)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="loadgen", daemon=True)
        self._clock: Callable[[], float] = time.monotonic
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase

    def start(self) -> LoadGenerator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 5)

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        limit = asyncio.Semaphore(self.max_concurrency)
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            # Each arrival is due at its own time (the last one's plus a Poisson gap), not
            # a gap after the thread woke: on a busy machine every wake-up comes late, and
            # gaps measured from it added the lateness up, so the demo offered less load
            # than it asked (3.3 req/s of 4 at 50 ms late). A late wake-up sends what is due.
            due = self._clock()
            while not self._stop.is_set():
                p = self.phase
                due += self.rng.expovariate(p.rate)
                await self._sleep(max(0.0, due - self._clock()))
                urls = self.endpoints()
                if not urls:
                    continue
                url = urls[self.sent % len(urls)]
                body = {
                    "model": self.model, "ignore_eos": True,
                    # A unique first word: no prefix-cache hits, every prompt is prefilled.
                    "prompt": f"r{self.sent} " + "w " * (_lognormal(
                        self.rng, p.prompt_mean, p.sigma, 16, p.prompt_max) - 1),
                    "max_tokens": _lognormal(self.rng, p.output_mean, 0.5, 4, 256),
                    "priority": self.rng.choices(list(p.classes),
                                                 weights=list(p.classes.values()))[0]}
                self.sent += 1
                if limit.locked():
                    self.dropped += 1  # open loop: a full client drops, it does not wait
                    continue
                task = asyncio.create_task(self._post(client, limit, url, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            running = list(tasks)
            for task in running:
                task.cancel()
            ended = await asyncio.gather(*running, return_exceptions=True)
            self.cancelled += sum(isinstance(e, asyncio.CancelledError) for e in ended)

    async def _post(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, url: str,
                    body: dict[str, object]) -> None:
        async with limit:
            try:
                resp = await client.post(url + "/v1/completions", json=body)
                if resp.status_code == 200:
                    self.ok += 1
                else:
                    self.failed += 1
            except httpx.HTTPError:
                self.failed += 1  # a replica stopped or restarting: load it did not take
