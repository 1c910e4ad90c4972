"""``cap_refusals``: the class a request refused at the connection cap is counted in,
from its head alone, under client grants. Driven through ``CapGate`` over ASGI (no
socket), a request's connection holding no slot, as the capped protocol marks it; the
live server's case is ``test_connection_cap.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slopilot.engine.connection_cap import SCOPE_KEY, CapGate, ConnectionCap
from slopilot.engine.request import Priority
from slopilot.engine.server.cap_refusals import cap_refusal_counter
from tests.engine.server.test_client_grants import CHECKOUT, REPORTS, bearer, grants, served_app


async def _refused(gate: CapGate, path: str, headers: dict[str, str],
                   method: str = "POST") -> int:
    """``method path`` on a connection without a slot; the status answered."""
    scope: dict[str, Any] = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "http_version": "1.1", "scheme": "http",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        SCOPE_KEY: False}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body is not read at the cap")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gate(scope, receive, send)
    return int(sent[0]["status"])


async def test_under_grants_a_refusal_counts_in_the_class_its_key_would_be_served_in(
        tmp_path: Path) -> None:
    app, backend = served_app(grants(), tmp_path)
    cap = ConnectionCap(1)
    gate = CapGate(app, cap, cap_refusal_counter(backend.metrics, app.state.clients))
    # Naming none: its grant's default class (reports: p2), not P1.
    assert await _refused(gate, "/v1/completions", bearer(REPORTS)) == 503
    assert await _refused(gate, "/v1/chat/completions",
                          {**bearer(CHECKOUT), "x-slopilot-priority": "p0"}) == 503
    # What the grants refuse (401: no such key; 403: a class the key may not name) was
    # never offered to the engine: in no class, as at the door.
    assert await _refused(gate, "/v1/completions", bearer("sk-nobody")) == 503
    assert await _refused(gate, "/v1/completions",
                          {**bearer(REPORTS), "x-slopilot-priority": "p0"}) == 503
    # Not a request for generation.
    assert await _refused(gate, "/v1/models", bearer(CHECKOUT), method="GET") == 503
    metrics = backend.metrics
    assert metrics.refused() == {Priority.P0: 1, Priority.P1: 0, Priority.P2: 1}
    assert metrics.arrived() == {Priority.P0: 1, Priority.P1: 0, Priority.P2: 1}
    assert cap.refused == 5


async def test_a_header_that_names_no_class_counts_as_the_default(tmp_path: Path) -> None:
    """A value that is no class (a word, two classes joined): the body may name one,
    which the cap does not read; counted as a request naming none (P1)."""
    app, backend = served_app(None, tmp_path)
    gate = CapGate(app, ConnectionCap(1), cap_refusal_counter(backend.metrics, None))
    for value in ("urgent", "p0, p2"):
        assert await _refused(gate, "/v1/completions", {"x-slopilot-priority": value}) == 503
    assert backend.metrics.refused() == {Priority.P0: 0, Priority.P1: 2, Priority.P2: 0}
