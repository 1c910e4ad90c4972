"""The OpenAI-compatible HTTP server of one engine replica.

Routes: ``/v1/completions``, ``/v1/chat/completions`` (SSE when ``stream``),
``/v1/models``, ``/health``, ``/metrics`` and ``/admin/config``. Every error is
OpenAI-shaped JSON. One app owns one ``AsyncEngine``: the engine thread starts with the
app's lifespan and drains when it ends.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.exceptions import HTTPException as StarletteHTTPException

from slopilot import __version__
from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.server.async_engine import AsyncEngine
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.errors import APIError, error_body
from slopilot.engine.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from slopilot.engine.server.serving import collect, prepare, sse_events, submit

log = logging.getLogger(__name__)
T = TypeVar("T")
ADMIN_TOKEN_ENV = "SLOPILOT_ADMIN_TOKEN"

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc} for status, desc in (
        (400, "Bad input"), (404, "Unknown model"), (413, "Prompt beyond the context"),
        (429, "Waiting queue full (see Retry-After)"), (503, "Draining"))}
_ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc} for status, desc in (
        (400, "Bad, unknown or non-live knob; nothing changed"),
        (401, "Missing or wrong bearer token"), (403, "No admin token configured"))}


@dataclass
class ServerState:
    engine: AsyncEngine
    backend: Backend
    admin_token: str | None
    drain_timeout_s: float


async def _client_gone(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``; if the client disconnects first, cancel it (its cleanup aborts)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def create_app(backend: Backend, *, admin_token: str | None = None,
               drain_timeout_s: float = 30.0, check_integrity: bool = True) -> FastAPI:
    """The app for ``backend``; its lifespan starts and drains the engine thread."""
    engine = AsyncEngine(backend.engine, backend.observer, check_integrity=check_integrity)
    state = ServerState(engine, backend, admin_token or None, drain_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            aborted = await engine.shutdown(state.drain_timeout_s)
            if aborted:
                log.warning("drain timed out: aborted %d requests", aborted)
            backend.close()

    app = FastAPI(title="slopilot engine", version=__version__, lifespan=lifespan)
    app.state.slopilot = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _param(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid request"))
        message = f"{param}: {msg}" if param else msg
        return JSONResponse(error_body(400, message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        return JSONResponse(error_body(500, f"internal error: {exc!r}"), status_code=500)

    async def _generate(body: CompletionRequest | ChatCompletionRequest,
                        request: Request) -> Response:
        prep = prepare(backend, body, request.headers)
        stream = await submit(engine, prep)
        if prep.stream:
            return StreamingResponse(sse_events(backend, prep, stream),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        result = await _unless_disconnected(request, collect(backend, prep, stream))
        if result is None:  # nobody is listening; the request was aborted
            return Response(status_code=499)
        return JSONResponse(result)

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(body, request)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _generate(body, request)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        card = ModelCard(id=backend.served_model_name, created=0,
                         max_model_len=backend.max_model_len)
        return ModelList(data=[card])

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.error is not None:
            return JSONResponse({"status": "failed", "error": repr(engine.error)}, 500)
        if engine.draining or not engine.is_running:
            return JSONResponse({"status": "draining"}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        # Always the classic text format: the OpenMetrics encoder would rename vllm:*.
        return Response(backend.metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    @app.get("/admin/config")
    async def get_config() -> dict[str, Any]:
        return engine.config.to_dict()

    @app.put("/admin/config", responses=_ADMIN_ERRORS, openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": {
            "type": "object", "description": "Knobs to change, e.g. {\"token_budget\": 512}",
            "additionalProperties": True}}}}})
    async def put_config(request: Request) -> dict[str, Any]:
        _check_admin(request, state.admin_token)
        try:
            overrides = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(overrides, dict):
            raise APIError(400, "the body must be a JSON object of knobs, e.g. "
                           "{\"token_budget\": 512}")
        try:
            new: EngineConfig = await engine.update_config(overrides)
        except ConfigError as exc:
            raise APIError(400, str(exc), param=exc.field, code="invalid_config") from None
        return new.to_dict()

    return app


def _check_admin(request: Request, token: str | None) -> None:
    if token is None:
        raise APIError(403, "live reconfiguration is disabled: start the server with "
                       f"{ADMIN_TOKEN_ENV} set or --admin-token-file FILE")
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.encode()):
        raise APIError(401, "missing or wrong admin token: send 'Authorization: Bearer "
                       "<token>'", headers={"WWW-Authenticate": "Bearer"})
