"""One request's token deltas, handed from the engine thread to an asyncio consumer.

The engine thread never touches a stream directly: it schedules ``_push`` on the event
loop, so the stream's state is only ever read and written on the loop's thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from slopilot.engine.request import FinishReason, Request


class _Aborter(Protocol):
    def abort(self, request_id: str, *, stopped: bool = False) -> None: ...


@dataclass(slots=True)
class StreamDelta:
    """New tokens of one request; ``finish_reason`` is set on the last delta only.

    ``token_times``: when the engine made each token, on the engine's clock (the
    delivery observes the gaps between them for the tokens it hands out)."""

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    token_times: list[float] = field(default_factory=list)


class RequestStream:
    """Async iterator of one request's token deltas. Lives on the asyncio loop."""

    def __init__(self, request: Request, engine: _Aborter) -> None:
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self._engine = engine
        self._tokens: list[int] = []
        self._times: list[float] = []
        self._finish: FinishReason | None = None
        self._error: BaseException | None = None
        self._event = asyncio.Event()
        # Set as well on every push: one waiter can watch several streams (n > 1).
        self.wakeup: asyncio.Event | None = None
        self.finished = False  # the consumer has seen the last delta

    def _push(self, token: int | None, finish: FinishReason | None,
              error: BaseException | None = None, made_at: float = 0.0) -> None:
        if token is not None:
            self._tokens.append(token)
            self._times.append(made_at)
        if finish is not None:
            self._finish = finish
        if error is not None:
            self._error = error
        self._event.set()
        if self.wakeup is not None:
            self.wakeup.set()

    @property
    def has_news(self) -> bool:
        """Whether ``poll`` has something to give now: a token, the end, or an error."""
        return not self.finished and (bool(self._tokens) or self._finish is not None
                                      or self._error is not None)

    @property
    def error(self) -> BaseException | None:
        """The error ``poll`` raises once reached, if any (read without consuming it)."""
        return self._error

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamDelta:
        if self.finished:
            raise StopAsyncIteration
        while (delta := self.poll()) is None:
            self._event.clear()
            await self._event.wait()
        return delta

    def poll(self) -> StreamDelta | None:
        """The delta waiting now, or None; raises the engine's error if it failed."""
        if self.finished or (not self._tokens and self._finish is None
                             and self._error is None):
            return None
        if self._error is not None:
            self.finished = True
            raise self._error
        tokens, self._tokens = self._tokens, []
        times, self._times = self._times, []
        if self._finish is not None:
            self.finished = True
        return StreamDelta(tokens, self._finish, times)

    def abort(self, *, stopped: bool = False) -> None:
        """End the request early: the client went away, or (``stopped``) a stop string
        matched in its text. A no-op once finished."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id, stopped=stopped)
