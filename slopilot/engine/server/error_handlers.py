"""Every error the app can raise, answered as OpenAI-shaped JSON.

Validation errors become 400s naming the parameter (``messages.0.role``); a string that
is not UTF-8 names its field; an unexpected exception is a 500 with a generic message
and an id to find it in the log, never the exception's repr (it can carry input, paths,
or other tenants' data).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from slopilot.engine.server.errors import APIError, error_body
from slopilot.engine.server.protocol import UnencodableText

log = logging.getLogger(__name__)


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request"}
    ctx = first.get("ctx")
    cause = ctx.get("error") if isinstance(ctx, dict) else None
    if isinstance(cause, UnencodableText):
        return JSONResponse(error_body(400, str(cause), param=cause.path or None),
                            status_code=400)
    if first.get("type") == "json_invalid":
        # FastAPI puts the byte offset where a field would go: there is no field to name.
        loc = tuple(first.get("loc", ()))
        where = f" at position {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
        reason = cause if isinstance(cause, str) else "JSON decode error"
        return JSONResponse(error_body(400, f"the request body is not valid JSON: {reason}"
                                       f"{where}"), status_code=400)
    param = _param(tuple(first.get("loc", ())))
    msg = str(first.get("msg", "invalid request"))
    message = f"{param}: {msg}" if param else msg
    # The message is pydantic's text (never the input); make sure it is JSON-safe too.
    message = message.encode("utf-8", "replace").decode("utf-8")
    return JSONResponse(error_body(400, message, param=param), status_code=400)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        incident = uuid.uuid4().hex[:12]
        log.exception("unhandled error %s serving %s", incident, request.url.path)
        return JSONResponse(error_body(500, f"internal error (incident {incident}); the "
                                       "server log has the details"), status_code=500)
