"""The HTTP server of one engine replica: the inference app, the admin app, one engine.

Inference routes (``openai_routes.py``): ``/v1/completions``, ``/v1/chat/completions``
(SSE when ``stream``), ``/v1/models`` and ``/v1/models/{id}``, ``/health``, ``/metrics``.
Admin routes (``admin.py``): ``/admin/config``, every method behind the bearer token, on
their own port when ``admin_port`` is given (else at /admin on the inference port).
Errors are OpenAI-shaped JSON (``error_handlers.py``). The engine thread starts with the inference
app's lifespan and drains when it ends.

Requests travel::

    socket -> EngineApp (admin port? -> admin app) -> ArrivalStamp
           -> ClientGate (with --clients: /v1 needs a granted key) -> route
           -> prepare() on a tokenizer thread -> AsyncEngine -> responses.py -> socket
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from slopilot import __version__
from slopilot.engine.clients import ClientClasses
from slopilot.engine.server import error_handlers
from slopilot.engine.server.admin import ADMIN_PREFIX, ADMIN_TOKEN_ENV, create_admin_app
from slopilot.engine.server.admin_credential import AdminCredential
from slopilot.engine.server.arrival import ArrivalStamp
from slopilot.engine.server.async_engine import AsyncEngine
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.client_counts import ClientCounts
from slopilot.engine.server.client_gate import ClientGate, ClientGrants
from slopilot.engine.server.logprobs_format import TokenText
from slopilot.engine.server.openai_routes import add_routes
from slopilot.engine.server.request_limits import (
    DEFAULT_MAX_BODY_BYTES,
    BodyLimit,
    ItemLimit,
)
from slopilot.engine.server.state import ServerState
from slopilot.engine.server.stepped_json import SteppedJSONRoute
from slopilot.engine.watched_file import WatchedFile

__all__ = ["ADMIN_TOKEN_ENV", "EngineApp", "ServerState", "create_app"]
log = logging.getLogger(__name__)


def default_tokenizer_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class EngineApp:
    """ASGI entry point: the admin app on ``admin_port`` (or at /admin on the inference
    port when there is none), the inference app everywhere else."""

    def __init__(self, public: FastAPI, admin: FastAPI, state: ServerState,
                 admin_port: int | None) -> None:
        self.public, self.admin, self.state = public, admin, state
        self.admin_port = admin_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan" and self._is_admin(scope):
            await self.admin(scope, receive, send)
        else:
            await self.public(scope, receive, send)

    def _is_admin(self, scope: Scope) -> bool:
        if self.admin_port is not None:
            server = scope.get("server")
            return server is not None and server[1] == self.admin_port
        path: str = scope.get("path", "")
        return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


def _lifespan(state: ServerState) -> object:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.tokenize = ThreadPoolExecutor(state.tokenizer_threads,
                                            thread_name_prefix="slopilot-tokenize")
        state.engine.start()
        try:
            yield
        finally:
            aborted = await state.engine.shutdown(state.drain_timeout_s)
            if aborted:
                log.warning("drain timed out: aborted %d requests", aborted)
            state.tokenize.shutdown(wait=False, cancel_futures=True)
            state.backend.close()

    return lifespan


def create_app(backend: Backend, *, admin_token: str | AdminCredential | None = None,
               drain_timeout_s: float = 30.0, check_integrity: bool = False,
               admin_port: int | None = None,
               tokenizer_threads: int | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               clients: WatchedFile[ClientClasses] | None = None,
               wall_clock: Callable[[], float] = time.time) -> EngineApp:
    """The server for ``backend``; ``admin_port`` is the bound admin port, if separate.

    ``clients``: the classes each API key may name (``slopilot serve --clients``), looked
    at per request; with them every /v1 route needs a granted key or the anonymous grant
    (``client_gate.py``) and the per-client counters are exported. None: a class is the
    client's to name and Authorization is ignored.

    A request body over ``max_body_bytes``, or of more JSON items than a request to this
    model can need (``body_items.body_items_bound``), is answered 413 while it is
    being read.
    ``wall_clock`` (Unix seconds) stamps the server's start: /v1/models' ``created``.

    ``check_integrity`` runs the scheduler's O(blocks) self-check whenever the engine
    goes idle: for tests and debugging (``slopilot serve --check-integrity``) only.
    ``admin_token``: the token, or only its digest (``AdminCredential``); empty or None
    disables the admin API.
    """
    credential = AdminCredential.of_token(admin_token) if isinstance(admin_token, str) \
        and admin_token else admin_token or None
    engine = AsyncEngine(backend.engine, backend.observer, check_integrity=check_integrity)
    state = ServerState(engine, backend, credential, drain_timeout_s,
                        tokenizer_threads or default_tokenizer_threads(),
                        TokenText(backend.tokenizer), started_at=int(wall_clock()))
    if clients is not None:
        counts = ClientCounts(backend.served_model_name)
        state.clients = ClientGrants(clients, counts)
        state.clients.current()  # its series, at 0, from the first scrape
        backend.metrics.registry.register(counts)
    public = FastAPI(title="slopilot engine", version=__version__,
                     lifespan=_lifespan(state))  # type: ignore[arg-type]
    public.state.slopilot = state
    error_handlers.install(public)
    # Inside the arrival stamp (the middleware added later runs first): a refused body's
    # request is still stamped on arrival, and nothing of it is parsed.
    public.add_middleware(BodyLimit, max_bytes=max_body_bytes,
                          items=ItemLimit(backend.max_model_len, backend.vocab_size))
    if state.clients is not None:
        # Outside the body limit: a client without a key is refused before any is read.
        public.add_middleware(ClientGate, grants=state.clients)
    public.add_middleware(ArrivalStamp, clock=backend.engine.clock.now)
    # Every body parsed in steps that let the other streams' chunks out (stepped_json.py).
    public.router.route_class = SteppedJSONRoute
    add_routes(public, state)
    admin = create_admin_app(engine, state.admin_token, backend.metrics)
    return EngineApp(public, admin, state, admin_port)
