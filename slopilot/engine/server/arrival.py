"""Stamp each HTTP request's arrival before anything else happens to it.

A pure ASGI middleware (no body buffering): the stamp is taken when the request reaches
the app, before its body is read, parsed or tokenized, on the engine's clock; TTFT and
end-to-end latency count from it, as the client's own clock would.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

SCOPE_KEY = "slopilot.arrival"


class ArrivalStamp:
    def __init__(self, app: ASGIApp, clock: Callable[[], float]) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SCOPE_KEY] = self.clock()
        await self.app(scope, receive, send)


def arrival_of(request: Request, clock: Callable[[], float]) -> float:
    """The stamp, or now when a request came in some other way (it never should)."""
    stamp = request.scope.get(SCOPE_KEY)
    return float(stamp) if stamp is not None else clock()
