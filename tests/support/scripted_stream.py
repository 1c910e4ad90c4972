"""The SSE bytes the built-in server writes for a request, its tokens arriving on a script.

A live server's chunks bring as many tokens as the engine made while the event loop was
busy elsewhere: which tokens share a chunk depends on the machine. Here the engine is a
script: each step hands some choices some tokens, and the server's writer
(``responses.sse_events``) reads them all before the next step, so a step of three
tokens for a choice is one delta of three, whatever the machine.

    written(backend, {"prompt": "a b", "n": 2, "stream": True, ...},
            [[(0, 1), (1, 3)], [(0, 2)], [(0, 1, LENGTH), (1, 1, LENGTH)]])

``stamped`` says, of each event, how many steps the engine had made when it was written:
0 is before the first token, which a client timing its chunks reads as one more.
"""

from __future__ import annotations

import asyncio
from typing import Any

from slopilot.engine.request import FinishReason
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.logprobs_format import TokenText
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from slopilot.engine.server.request_stream import RequestStream
from slopilot.engine.server.responses import Delivery, sse_events
from slopilot.engine.server.serving import prepare

TOKEN = 7
"""The token every step hands out (the placeholder tokenizer reads it as "tok")."""

Push = tuple[int, int] | tuple[int, int, FinishReason]
"""A choice's index, how many tokens it gets, and (on its last) how it finished."""

# Loop passes a step may take to be read: the writer runs on this loop alone, so it has
# read a step within a few; only a writer that stopped reading runs out of them.
_MAX_PASSES = 10_000


class _NoEngine:
    """Stands in for the engine: an abort (a stop string matched) has nothing to stop."""

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        del request_id, stopped


def written(backend: Backend, body: dict[str, Any], steps: list[list[Push]]) -> bytes:
    """The bytes the server writes for ``body`` (a chat request where it has
    ``messages``), its choices' tokens arriving as ``steps`` say."""
    return "".join(event for _, event in stamped(backend, body, steps)).encode()


def stamped(backend: Backend, body: dict[str, Any],
            steps: list[list[Push]]) -> list[tuple[int, str]]:
    """Each SSE event the server writes for ``body``, with the number of ``steps`` made
    when it was written. The writer runs until it waits for the engine before the first
    step, so what it writes before any token shows as step 0."""
    request = ChatCompletionRequest(**body) if "messages" in body else \
        CompletionRequest(**body)
    return asyncio.run(_written(backend, request, steps))


async def _written(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
                   steps: list[list[Push]]) -> list[tuple[int, str]]:
    prep = prepare(backend, body, {}, arrival_time=0.0)
    streams = [RequestStream(c.request, _NoEngine()) for c in prep.choices]
    made = 0
    delivery = Delivery(backend, prep, streams, lambda: float(made), slo=None)
    events: list[tuple[int, str]] = []

    async def write() -> None:
        async for event in sse_events(delivery, TokenText(backend.tokenizer)):
            events.append((made, event))

    writer = asyncio.ensure_future(write())
    # The writer waits for the engine once it watches every stream (``_deltas``).
    for _ in range(_MAX_PASSES):
        if writer.done() or all(s.wakeup is not None for s in streams):
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError("the writer did not wait for the first token")
    for step in steps:
        made += 1
        for push in step:
            index, count = push[0], push[1]
            finish = push[2] if len(push) == 3 else None
            for i in range(count):
                streams[index]._push(TOKEN, finish if i == count - 1 else None)
        for _ in range(_MAX_PASSES):
            if writer.done() or not any(_pending(s) for s in streams):
                break
            await asyncio.sleep(0)
        else:
            raise AssertionError(f"the writer did not read step {step}")
    await writer
    return events


def _pending(stream: RequestStream) -> bool:
    """Whether ``stream`` holds a delta the writer has not read."""
    return not stream.finished and (bool(stream._tokens) or stream._finish is not None)
