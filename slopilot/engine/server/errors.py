"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``, each
status's type and default code from ``openai_errors`` (the meter's too)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse

from slopilot.engine.openai_errors import ErrorBody, error_body

__all__ = ["APIError", "error_body", "json_error_where"]


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

    def body(self) -> ErrorBody:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def json_error_where(reason: str, position: int | None) -> str:
    """A JSON decoder's reason and the offset it names: "Expecting value at position 3".
    Two of ``json``'s reasons end in "at" ("Unterminated string starting at"), and
    appending " at position" to them read "starting at at position 9"."""
    if position is None:
        return reason
    return f"{reason.removesuffix(' at')} at position {position}"
