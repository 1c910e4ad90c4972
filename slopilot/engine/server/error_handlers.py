"""Every error the app can raise, answered as OpenAI-shaped JSON.

Validation errors become 400s naming the parameter as sent (``messages.0.role``, never
a union member pydantic tried, such as ``stop.str``); a string that is not UTF-8 names
its field; an unexpected exception is a 500 with a generic message and an id to find it
in the log, never the exception's repr (it can carry input, paths, or other tenants'
data).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from slopilot.engine.server.errors import APIError, error_body, json_error_where
from slopilot.engine.server.protocol import FieldError

log = logging.getLogger(__name__)


def _param(path: tuple[Any, ...]) -> str | None:
    return ".".join(str(p) for p in path) or None


def _sent_path(error: Mapping[str, Any], body: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The error's path as the client sent it, and the union member it is under.

    pydantic puts the member it tried into the path of a field of several types
    (``stop.str``, ``prompt.list[int].0``): a step that does not lead into the body is
    such a member, except the name of a missing field, last.
    """
    loc = tuple(error.get("loc", ()))
    if loc[:1] == ("body",):
        loc = loc[1:]
    if not isinstance(body, (dict, list)):
        return loc, ()
    path: list[Any] = []
    member = 0  # how much of ``loc`` names the union member
    node = body
    for i, part in enumerate(loc):
        into_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        into_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if into_dict or into_list:
            node = node[part]
        elif not (error.get("type") == "missing" and i == len(loc) - 1):
            member = i + 1
            continue
        path.append(part)
    return tuple(path), loc[:member]


def _closest(errors: Sequence[Any], body: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """The error to report, and its path: the first field's, and for a field of several
    types the one the value came closest to (deepest into it, then fewest errors)."""
    found = [(dict(e), *_sent_path(e, body)) for e in errors]
    field = found[0][1][:1]
    per_member = Counter(member for _, _, member in found)
    error, path, _ = min((f for f in found if f[1][:1] == field),
                         key=lambda f: (-len(f[1]), per_member[f[2]]))
    return error, path


def _not_json(content_type: str | None) -> str:
    """Why a body was not read as JSON: FastAPI reads a body as JSON only under a JSON
    content type, and ``curl -d`` sends a form's."""
    shown = repr(content_type) if content_type else "no Content-Type"
    return (f"the request body must be JSON sent with Content-Type: application/json (got "
            f"{shown}); with curl, add -H 'Content-Type: application/json'")


def _unparsable(exc: BaseException | None) -> str | None:
    """Why Python's JSON reader gave up on a body, where FastAPI says only "There was an
    error parsing the body" (it keeps the reader's exception as the cause)."""
    if isinstance(exc, RecursionError):
        return ("the request body is not valid JSON here: it is nested too deeply to read "
                "(no field of this API nests more than a few levels); send it flat")
    if isinstance(exc, UnicodeDecodeError):
        return (f"the request body is not UTF-8 (an invalid byte at offset {exc.start}); "
                "send the JSON encoded as UTF-8")
    if isinstance(exc, ValueError) and "digits" in str(exc):
        # Python reads no integer of over 4300 digits (its int_max_str_digits).
        return ("a number in the request body has too many digits to read (at most "
                "4300); no field of this API takes one near that long")
    return None


def validation_response(exc: RequestValidationError, content_type: str | None = None
                        ) -> JSONResponse:
    """The OpenAI-shaped 400 for a body that did not validate. ``content_type``: the
    request's header, to name it where the body was not read as JSON at all."""
    errors = exc.errors()
    media = (content_type or "").partition(";")[0].strip().lower()
    if not (media == "application/json" or media.endswith("+json")) and any(
            tuple(e.get("loc", ())) == ("body",) for e in errors):
        return JSONResponse(error_body(400, _not_json(content_type)), status_code=400)
    if any(tuple(e.get("loc", ())) == ("body",) and e.get("type") == "missing"
           for e in errors):
        return JSONResponse(error_body(400, "the request body is empty: send the request's "
                                       "fields as a JSON object (with curl, -d '{...}')"),
                            status_code=400)
    first: dict[str, Any] = {"loc": (), "msg": "invalid request"}
    path: tuple[Any, ...] = ()
    if errors:
        first, path = _closest(errors, exc.body)
    ctx = first.get("ctx")
    cause = ctx.get("error") if isinstance(ctx, dict) else None
    if isinstance(cause, FieldError):
        return JSONResponse(error_body(400, str(cause), param=cause.path or None),
                            status_code=400)
    if first.get("type") == "json_invalid":
        # FastAPI puts the byte offset where a field would go: there is no field to name.
        loc = tuple(first.get("loc", ()))
        where = loc[-1] if loc and isinstance(loc[-1], int) else None
        reason = json_error_where(cause if isinstance(cause, str) else "JSON decode error",
                                  where)
        return JSONResponse(error_body(400, f"the request body is not valid JSON: {reason}"),
                            status_code=400)
    param = _param(path)
    msg = str(first.get("msg", "invalid request"))
    if first.get("type") == "value_error" and isinstance(cause, ValueError):
        # A validator's own words: pydantic's msg puts "Value error, " in front of them.
        msg = str(cause)
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
        return validation_response(exc, request.headers.get("content-type"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        why = _unparsable(exc.__cause__) if exc.status_code == 400 else None
        return JSONResponse(error_body(exc.status_code, why or str(exc.detail)),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        incident = uuid.uuid4().hex[:12]
        log.exception("unhandled error %s serving %s", incident, request.url.path)
        return JSONResponse(error_body(500, f"internal error (incident {incident}); the "
                                       "server log has the details"), status_code=500)
