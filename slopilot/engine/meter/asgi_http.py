"""The meter's HTTP on ASGI: the headers it passes on between hops, and its own answers.

- A request goes to the upstream with the client's headers, hop-by-hop ones dropped
  (RFC 9110 7.6.1), and the answer comes back with the upstream's, the same ones dropped.
- Each answer carries one ``date``: the engine's passes through (the server adds none,
  or there would be two), and the meter dates its own answers and any that came without.
"""

from __future__ import annotations

import email.utils
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# RFC 9110 7.6.1, and what a proxy must not pass on; host and length are the new hop's.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding",
                         "upgrade", "host", "content-length"})


def request_headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        if name not in _HOP_BY_HOP:
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    # httpx would add its own accept-encoding where the client sent none.
    headers.setdefault("accept-encoding", "identity")
    return headers


def response_headers(headers: httpx.Headers, *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    drop = _HOP_BY_HOP - ({"content-length"} if keep_length else set())
    passed = [(k.encode("latin-1"), v.encode("latin-1"))
              for k, v in headers.multi_items() if k.lower() not in drop]
    # RFC 9110 6.6.1: a recipient with a clock forwarding a response without one adds it.
    return passed if "date" in headers else [*passed, date_header()]


def date_header() -> tuple[bytes, bytes]:
    """A ``date`` header for now, as uvicorn would have written it."""
    return (b"date", email.utils.formatdate(usegmt=True).encode())


async def answer(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), date_header()]})
    await send({"type": "http.response.body", "body": data})
