"""The meter's refusal of the 16.5 MB body of 5.5 million ignored values (``"x": [1, ...]``),
sent in 1 MiB messages: how long until its 413, whether it reached the stand-in vLLM, and
the longest gap a task beside it saw between two turns of the loop.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/meter_body_items.py``
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import tempfile
import time
from typing import Any

import httpx

from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.verdicts import Verdicts
from tests.engine.meter.test_meter import SLO

BODY = (b'{"model": "llama", "prompt": "hi", "stream": true, "x": ['
        + b"1, " * 5_499_999 + b"1]}")


async def main() -> None:
    slo = pathlib.Path(tempfile.mkdtemp()) / "slo.json"
    slo.write_text(json.dumps(SLO))
    forwarded: list[httpx.Request] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        forwarded.append(request)
        return httpx.Response(500)

    meter = Meter("http://127.0.0.1:8001", SLOWatch(slo, Verdicts()), Priority.P0,
                  client=httpx.AsyncClient(transport=httpx.MockTransport(vllm)),
                  max_body_bytes=17 << 20, body_budget_bytes=64 << 20)
    pieces = [BODY[i:i + (1 << 20)] for i in range(0, len(BODY), 1 << 20)]
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        if pieces:
            return {"type": "http.request", "body": pieces.pop(0), "more_body": bool(pieces)}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(message)

    gap, done = [0.0], [False]

    async def beside() -> None:
        last = time.perf_counter()
        while not done[0]:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gap[0], last = max(gap[0], now - last), now

    other = asyncio.ensure_future(beside())
    start = time.perf_counter()
    await meter({"type": "http", "method": "POST", "path": "/v1/completions",
                 "raw_path": b"/v1/completions", "query_string": b"", "headers": []},
                receive, send)
    took = time.perf_counter() - start
    done[0] = True
    await other
    print(f"{len(BODY) / 1e6:.1f} MB: status {sent[0]['status']}, forwarded {len(forwarded)}, "
          f"answered in {took * 1e3:.0f} ms, longest loop gap {gap[0] * 1e3:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
