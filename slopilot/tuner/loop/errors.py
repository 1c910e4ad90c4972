"""The loop's one error type."""

from __future__ import annotations


class ControllerError(ValueError):
    """Bad controller settings or persisted state; the message names the field and fix."""
