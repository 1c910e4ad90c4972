"""OpenAI-shaped error bodies, ``{"error": {"message", "type", "param", "code"}}``, as
``slopilot serve`` and ``slopilot meter`` both write them.

One fixed table gives each status its type and default code, so the two answer the same
condition alike, and no Python release changes a code under its clients: built from
``http.HTTPStatus``' phrases, the 413's code was ``request_entity_too_large`` on Python
3.11 and 3.12 and ``content_too_large`` on 3.13, where the meter said
``request_too_large``. A refusal with a code of its own (``context_length_exceeded``,
``queue_full``, ...) gives it; these are for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

ErrorBody = dict[str, dict[str, str | None]]

# OpenAI's error types by status, as its SDK maps them to exception classes.
TYPES: Mapping[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
    500: "internal_server_error", 502: "server_error", 503: "service_unavailable",
}

# The names Python 3.11's phrases gave, which clients have seen, except the 413's and the
# 431's: the names the meter (413) and both heads' refusals (431) already wrote.
CODES: Mapping[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 408: "request_timeout", 411: "length_required",
    413: "request_too_large", 415: "unsupported_media_type",
    422: "unprocessable_entity", 429: "too_many_requests",
    431: "request_header_too_large", 500: "internal_server_error", 502: "bad_gateway",
    503: "service_unavailable", 504: "gateway_timeout",
}


def error_type(status: int) -> str:
    return TYPES.get(status) or ("server_error" if status >= 500 else
                                 "invalid_request_error")


def error_code(status: int) -> str:
    return CODES.get(status) or f"http_{status}"


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> ErrorBody:
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code or error_code(status)}}
