"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from fastapi.responses import JSONResponse

# OpenAI's error types by status, as its SDK maps them to exception classes.
_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
    500: "internal_server_error", 503: "service_unavailable",
}


class APIError(Exception):
    """Raised anywhere in a handler; the app turns it into the JSON error response."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict[str, dict[str, str | None]]:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_")
    return {"error": {"message": message, "type": kind, "param": param,
                      "code": code or HTTPStatus(status).phrase.lower().replace(" ", "_")}}


def json_error_where(reason: str, position: int | None) -> str:
    """A JSON decoder's reason and the offset it names: "Expecting value at position 3".
    Two of ``json``'s reasons end in "at" ("Unterminated string starting at"), and
    appending " at position" to them read "starting at at position 9"."""
    if position is None:
        return reason
    return f"{reason.removesuffix(' at')} at position {position}"
