"""The admin API (live knobs): its own app, every method behind the bearer token.

``GET /admin/config`` reads the knobs, ``PUT`` changes them (validated whole, applied at
the next iteration, refused whole on any bad field), ``OPTIONS`` lists the methods.
``GET /admin/slo`` reads the objectives each request is judged by once delivered
(``null``: none, nothing judged), ``PUT`` replaces them whole (``SLOSpec.from_dict``: the
CR's ``spec.slo``), for the requests that arrive from then on. The
token is checked before routing, so without it nothing is learnt, not even which paths
or methods exist. ``slopilot serve --admin-port N`` serves this app alone on port N (the
inference port then has no /admin at all, and a NetworkPolicy can keep tenants off N);
without it, /admin/* on the inference port is routed here.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from slopilot import __version__
from slopilot.engine.config import ConfigError, EngineConfig, knobs_from_json
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.server import error_handlers
from slopilot.engine.server.admin_credential import (
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_SHA256_ENV,
    AdminCredential,
)
from slopilot.engine.server.async_engine import AsyncEngine, EngineDeadError, EngineDrainingError
from slopilot.engine.server.errors import APIError, error_body, json_error_where
from slopilot.engine.server.request_limits import BodyLimit
from slopilot.engine.server.response_models import ErrorResponse
from slopilot.engine.server.responses import engine_error
from slopilot.engine.slo import SLOError, SLOSpec

__all__ = ["ADMIN_TOKEN_ENV", "AdminCredential", "create_admin_app", "token_refusal"]
ADMIN_PREFIX = "/admin"
ADMIN_MAX_BODY_BYTES = 64 * 2**10
_METHODS = "GET, PUT, OPTIONS"
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": desc} for status, desc in (
        (401, "Missing or wrong bearer token"), (403, "No admin token configured"))}
_PUT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Bad, unknown or non-live knob; nothing "
          "changed"},
    500: {"model": ErrorResponse, "description": "The engine loop failed (code engine_dead)"},
    503: {"model": ErrorResponse, "description": "The engine is stopped (code draining)"},
    **_ERRORS}


def token_refusal(credential: AdminCredential | None, authorization: str) -> APIError | None:
    """Why a request with this Authorization header may not use the admin API, if so."""
    if credential is None:
        return APIError(403, "the admin API is disabled: start the server with "
                        f"{ADMIN_TOKEN_ENV} or {ADMIN_TOKEN_SHA256_ENV} set, or "
                        "--admin-token-file FILE")
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credential.admits(given.strip()):
        return APIError(401, "missing or wrong admin token: send 'Authorization: Bearer "
                        "<token>'", headers={"WWW-Authenticate": "Bearer"})
    return None


class TokenGate:
    """ASGI: every HTTP request needs the token before the app sees it."""

    def __init__(self, app: ASGIApp, credential: AdminCredential | None) -> None:
        self.app, self.credential = app, credential

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                           if k == b"authorization"), "")
            refusal = token_refusal(self.credential, header)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_admin_app(engine: AsyncEngine, credential: AdminCredential | None,
                     metrics: EngineMetrics) -> FastAPI:
    """``metrics``: the engine's, which hold the SLO its requests are judged by."""
    app = FastAPI(title="slopilot engine admin", version=__version__,
                  openapi_url=f"{ADMIN_PREFIX}/openapi.json", docs_url=None, redoc_url=None)
    error_handlers.install(app)
    # A config patch is a handful of knobs: nothing near this needs reading or parsing.
    app.add_middleware(BodyLimit, max_bytes=ADMIN_MAX_BODY_BYTES,
                       hint="(the admin API's limit): send only the knobs to change")
    # Added last, so it runs first: a caller without the token is refused unread.
    app.add_middleware(TokenGate, credential=credential)

    @app.get(f"{ADMIN_PREFIX}/config", responses=_ERRORS)
    async def get_config() -> dict[str, Any]:
        return engine.config.to_dict()

    @app.options(f"{ADMIN_PREFIX}/config", status_code=204, responses=_ERRORS)
    async def options_config() -> Response:
        return Response(status_code=204, headers={"Allow": _METHODS})

    @app.put(f"{ADMIN_PREFIX}/config", responses=_PUT_ERRORS, openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": {
            "type": "object", "description": "Knobs to change, e.g. {\"token_budget\": 512}",
            "additionalProperties": True}}}}})
    async def put_config(request: Request) -> dict[str, Any]:
        overrides = await _json_object(request, "knobs, e.g. {\"token_budget\": 512}")
        try:
            new: EngineConfig = await engine.update_config(knobs_from_json(overrides))
        except ConfigError as exc:
            message = str(exc).encode("utf-8", "replace").decode("utf-8")
            raise APIError(400, message, param=exc.field, code="invalid_config") from None
        except (EngineDeadError, EngineDrainingError) as exc:
            raise engine_error(exc) from None
        return new.to_dict()

    @app.get(f"{ADMIN_PREFIX}/slo", responses=_ERRORS)
    async def get_slo() -> dict[str, Any] | None:
        return None if metrics.slo is None else metrics.slo.to_dict()

    @app.put(f"{ADMIN_PREFIX}/slo", responses=_PUT_ERRORS, openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": {
            "type": "object", "description": "The whole SLO, as an LLMDeployment's "
            "spec.slo, e.g. {\"profile\": \"strict\"}", "additionalProperties": True}}}}})
    async def put_slo(request: Request) -> dict[str, Any]:
        data = await _json_object(request, "objectives, e.g. {\"profile\": \"strict\"}")
        try:
            slo = SLOSpec.from_dict(data)
        except SLOError as exc:
            raise APIError(400, str(exc), param=exc.field, code="invalid_slo") from None
        metrics.set_slo(slo)
        return slo.to_dict()

    @app.exception_handler(405)
    async def _method(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body(405, f"{request.method} is not allowed here; use "
                                       f"{_METHODS}"), status_code=405,
                            headers={"Allow": _METHODS})

    return app


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    try:
        data = json.loads(await request.body() or b"null")
    except json.JSONDecodeError as exc:
        raise APIError(400, "the body is not valid JSON: "
                       f"{json_error_where(exc.msg, exc.pos)}") from None
    except UnicodeDecodeError:
        raise APIError(400, "the body is not valid JSON: it is not UTF-8") from None
    except RecursionError:  # nested past the parser's depth: nothing here is that deep
        raise APIError(400, f"the body is not valid JSON here: it is nested too deeply; "
                       f"send a flat object of {what}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object of {what}")
    return data
