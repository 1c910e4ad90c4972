"""How error messages quote what a user supplied: a short excerpt, never a whole file.

A scenario or a trace is data a user (or an attacker) hands in; a message that echoes
all of it buries the reason and can carry whatever the file holds into logs.
"""

from __future__ import annotations

_EXCERPT = 80


def excerpt(value: object) -> str:
    """``value``'s repr, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= _EXCERPT else text[:_EXCERPT - 3] + "..."
