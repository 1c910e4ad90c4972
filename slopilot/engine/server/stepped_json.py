"""A request body's JSON parsed in steps that let the event loop run between two, as
FastAPI parses every body of the inference routes here (``SteppedJSONRoute``).

``json.loads`` is one call that holds the GIL to its end, on the event loop or on a
worker thread alike (measured: 5.5 million values, 0.59 s on the loop, 0.61 s of the
loop's ticks stopped from a thread), and every stream's next chunk waits for it. The
body's items are bounded before it is parsed (``body_items.ItemLimit``), but a body
a deployment serves may still be large: 16 prompts of a 128k context as token ids took
146 ms, a full-vocabulary ``logit_bias`` 72-120 ms. ``json_steps.loads`` (the meter's)
parses it in parts of at most ``STEP_BYTES`` a step, its value and its errors
``json.loads``' own, so FastAPI's handling of a body that is no JSON is unchanged; a step
took 2-11 ms on those bodies, the whole about as long as one ``json.loads``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from slopilot.engine.meter import json_steps

STEP_BYTES = 64 << 10
"""The most bytes scanned and parsed in one step (the meter's judge steps as far)."""


async def loads(body: bytes, step: int = STEP_BYTES) -> Any:
    """``json.loads(body)``, the loop let run between steps of at most ``step`` bytes."""
    steps = json_steps.loads(body, step, step)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value, _ = done.value
            return value
        await asyncio.sleep(0)


class SteppedJSONRequest(Request):
    """A request whose ``json()`` (what FastAPI reads a JSON body by) parses in steps."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await loads(await self.body())
        return self._json


class SteppedJSONRoute(APIRoute):
    """FastAPI's route, its request's body parsed by ``SteppedJSONRequest`` (FastAPI's
    documented way to change how a route reads its request)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def stepped(request: Request) -> Response:
            return await handler(SteppedJSONRequest(request.scope, request.receive))

        return stepped
