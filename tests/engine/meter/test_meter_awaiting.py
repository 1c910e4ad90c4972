"""The meter's gauge of the choices still waiting for a first token (``CLIENT_AWAITING``).

vLLM queues what it cannot run: a class its config starves has streams open and no
first token in any histogram until their clients give up. The meter exports them at each
scrape, apart by whether their client has waited past its class's TTFT target (P0:
500 ms here), which the rules read at a window's end as first tokens never given.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from slopilot.engine.meter.client_latency import CLIENT_AWAITING
from slopilot.engine.slo import WITHIN_TTFT_TARGET
from tests.engine.meter.test_client_latency import scrape
from tests.engine.meter.test_meter import HOLD, STREAM, Client, Upstream, event, meter_for, run
from tests.support.waits import HANG_GUARD_S


def awaiting(families: dict[str, Any]) -> dict[str, float]:
    """``CLIENT_AWAITING`` by within_ttft_target."""
    return {s.labels[WITHIN_TTFT_TARGET]: s.value
            for s in families[CLIENT_AWAITING].samples}


def test_open_streams_without_a_first_token_are_counted_by_their_wait(
        tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([HOLD])

    async def go() -> list[dict[str, float]]:
        seen = [awaiting(await scrape(meter, now))]
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request("POST", "/v1/completions",
                                                    {**STREAM, "n": 3}))
        while not client.sent:  # the engine took it: its answer's head is written
            await asyncio.sleep(0)
        now[0] = 0.2
        seen.append(awaiting(await scrape(meter, now)))
        now[0] = 30.0
        seen.append(awaiting(await scrape(meter, now)))
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        seen.append(awaiting(await scrape(meter, now)))
        return seen

    before, within, past, gone = run(go)
    assert before == {"false": 0, "true": 0}
    assert within == {"false": 0, "true": 3}  # 200 ms of P0's 500
    assert past == {"false": 3, "true": 0}  # 30 s: each a first token missed so far
    assert gone == {"false": 0, "true": 0}  # ended: counted abandoned instead


def test_a_choice_is_no_longer_waiting_once_its_first_token_is_written(
        tmp_path: Path) -> None:
    upstream, now = Upstream(), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", index=0), HOLD])

    async def go() -> dict[str, float]:
        client = Client(meter, now)
        task = asyncio.ensure_future(client.request(
            "POST", "/v1/completions", {**STREAM, "n": 2}, written_at=[0.25]))
        while sum(1 for m in client.sent if m.get("body")) < 1:
            await asyncio.sleep(0)
        now[0] = 2.0
        out = awaiting(await scrape(meter, now))
        client.leave.set()
        await asyncio.wait_for(task, HANG_GUARD_S)
        return out

    # Choice 0 got its first token at 250 ms; choice 1, none after 2 s: past the target.
    assert run(go) == {"false": 1, "true": 0}
