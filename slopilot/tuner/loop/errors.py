"""The loop's one error type, and how an error is said in a decision."""

from __future__ import annotations


class ControllerError(ValueError):
    """Bad controller settings or persisted state; the message names the field and fix."""


CAUSE_CHARS = 200
"""The most of a cause's first line a decision quotes: a driver's line may run on."""


def said(exc: BaseException) -> str:
    """``exc``'s message, with the first line of the error it was raised from (``raise
    ... from``) where there is one: Optuna's ``StorageInternalError`` says "invalid data
    in the commit, e.g. exceeding max length" of a database that went away or is no
    database at all, whose driver's own line ("file is not a database") names the
    cause."""
    text = str(exc).strip()
    cause = exc.__cause__
    if cause is None:
        return text
    lines = str(cause).strip().splitlines()
    first = lines[0][:CAUSE_CHARS] if lines else type(cause).__name__
    return f"{text} (cause: {first})"
