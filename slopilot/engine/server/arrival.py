"""Stamp each HTTP request's arrival before anything else happens to it.

The server's HTTP protocol stamps the moment the request's last byte (its body's end)
reached the kernel (``http_arrival.h11_protocol``: a pipelined request too, which reaches
the app only once the one before it is answered), read here once the body was read whole
(``arrival_of``, from a route whose body FastAPI has parsed); this pure ASGI middleware
stamps at the app's door where no earlier stamp exists (an app served some other way).
Either way it is before the body is parsed or tokenized, on the engine's clock: TTFT and
end-to-end latency count from it. A client's own upload time is not in it: its link's,
which no replica could shorten.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from slopilot.engine.http_arrival import SCOPE_KEY


class ArrivalStamp:
    def __init__(self, app: ASGIApp, clock: Callable[[], float]) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault(SCOPE_KEY, self.clock())
        await self.app(scope, receive, send)


def arrival_of(request: Request, clock: Callable[[], float]) -> float:
    """The stamp, or now when a request came in some other way (it never should). Read
    once the body was read whole: until then the protocol's stamp is the head's."""
    stamp = request.scope.get(SCOPE_KEY)
    return float(stamp) if stamp is not None else clock()
