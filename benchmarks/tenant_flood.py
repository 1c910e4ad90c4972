"""One tenant editing many CRs without pause, and a quiet tenant's spec reconcile beside
it: on kopf's pool as a sync handler runs (``pool``, first come first served, what the
spec handler was) and on the spec reconciles' fair slots (``fair``, what it is:
spec_reconciles.py), side by side in one run.

The real reconcile runs against the tests' Kubernetes API emulator (tests/support), on
``HANDLER_THREADS`` threads as kopf's pool. Each noisy CR has a worker that runs its
next reconcile as soon as its last one ends, as kopf runs one handler per object at a
time under an edit loop. Per configuration the quiet tenant's reconcile is timed
``--rounds`` times alone and during the flood; each figure is a median. The emulator
is one process on a shared machine, so absolute times read high; the ratio of the
flooded to the lone time is the point.

    .venv/bin/python benchmarks/tenant_flood.py [--noisy 128] [--rounds 5]

Ends with ``RESULT noisy=... pool_alone_ms=... pool_flood_ms=... pool_ratio=...
fair_alone_ms=... fair_flood_ms=... fair_ratio=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kopf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' emulator

from slopilot.operator import handlers
from slopilot.operator.cr_locks import LockTable
from slopilot.operator.policy import OperatorPolicy
from slopilot.operator.settings import HANDLER_THREADS
from slopilot.operator.spec_reconciles import SpecReconciles
from tests.operator.operator_support import Cluster, llmd, operator_mint, with_namespaces
from tests.support.kube_server import serve_emulator

log = logging.getLogger("tenant_flood")
# The handlers, called as kopf calls them (kopf's types ask for every kwarg it passes).
reconcile_llmdeployment: Any = handlers.reconcile_llmdeployment
Handler = Callable[[dict[str, Any]], Awaitable[None]]


def created(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    body = llmd(name)
    body["metadata"]["namespace"] = namespace
    return Cluster(cluster.custom.api_client, namespace).create(body)


def handler(mode: str, memo: kopf.Memo, pool: Executor) -> Handler:
    """The spec handler as kopf would run it: ``pool``, the sync reconcile submitted to
    kopf's threads; ``fair``, the async handler, on the spec reconciles' slots."""
    if mode == "pool":
        async def on_pool(body: dict[str, Any]) -> None:
            await asyncio.wrap_future(pool.submit(handlers.reconcile_spec, body, memo, log))
        return on_pool

    async def on_slots(body: dict[str, Any]) -> None:
        await reconcile_llmdeployment(body=body, memo=memo, logger=log)
    return on_slots


async def flood(run: Handler, noisy: list[dict[str, Any]], quiet: list[dict[str, Any]],
                rounds: int) -> tuple[float, float]:
    """Median ms of the quiet tenant's reconcile, alone and during the flood."""
    async def timed(body: dict[str, Any]) -> float:
        start = time.perf_counter()
        await run(body)
        return (time.perf_counter() - start) * 1000

    alone = [await timed(quiet[i % len(quiet)]) for i in range(rounds)]
    stop = asyncio.Event()

    async def edit_loop(body: dict[str, Any]) -> None:
        while not stop.is_set():
            await run(body)

    workers = [asyncio.create_task(edit_loop(body)) for body in noisy]
    await asyncio.sleep(1.0)  # every noisy CR's handler queued
    flooded = [await timed(quiet[i % len(quiet)]) for i in range(rounds)]
    stop.set()
    await asyncio.gather(*workers)
    return statistics.median(alone), statistics.median(flooded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noisy", type=int, default=128, help="the noisy tenant's CRs")
    parser.add_argument("--rounds", type=int, default=5, help="timed quiet reconciles")
    args = parser.parse_args()
    handlers.post_events = lambda *a, **k: None  # kopf's event posting needs its context
    logging.disable(logging.WARNING)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, serve_emulator(Path(tmp)) as kube, \
            kube.api_client() as client, ThreadPoolExecutor(HANDLER_THREADS) as pool:
        cluster = with_namespaces(kube, Cluster(client, "noisy"), "noisy", "quiet")
        noisy = [created(cluster, "noisy", f"n{i}") for i in range(args.noisy)]
        quiet = [created(cluster, "quiet", f"q{i}") for i in range(3)]
        for mode in ("pool", "fair"):
            memo = kopf.Memo(kube=cluster.kube, tokens=operator_mint(cluster),
                             policy=OperatorPolicy(), locks=LockTable(),
                             spec_reconciles=SpecReconciles(executor=pool))
            alone, flooded = asyncio.run(flood(handler(mode, memo, pool), noisy, quiet,
                                               args.rounds))
            figures |= {f"{mode}_alone_ms": alone, f"{mode}_flood_ms": flooded,
                        f"{mode}_ratio": flooded / alone}
            print(f"{mode}: the quiet tenant's reconcile {alone:.0f} ms alone, "
                  f"{flooded:.0f} ms beside {args.noisy} noisy CRs", flush=True)
    print(f"RESULT noisy={args.noisy} " + " ".join(f"{k}={v:.4g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
