"""How error messages quote what a user supplied: a short excerpt, never a whole file.

A scenario or a trace is data a user (or an attacker) hands in; a message that echoes
all of it buries the reason and can carry whatever the file holds into logs.
"""

from __future__ import annotations

import reprlib

_EXCERPT = 80
# Bounded while it is built, not only cut afterwards: a YAML alias bomb is a tiny file
# whose full repr is not (9 levels of 9 aliases each are 9**9 strings).
class _AsWritten(reprlib.Repr):
    """JSON's and YAML's literals as their files write them (``true``, ``null``), not as
    Python's ``True`` and ``None``: a user never wrote those."""

    def repr_bool(self, x: bool, level: int) -> str:
        return "true" if x else "false"

    def repr_NoneType(self, x: None, level: int) -> str:  # reprlib dispatches by type name
        return "null"


_REPR = _AsWritten()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring = _REPR.maxother = 160
_REPR.maxlong = 60


def excerpt(value: object) -> str:
    """``value``'s repr (its JSON literals as written), cut to a few dozen characters."""
    text = _REPR.repr(value)
    return text if len(text) <= _EXCERPT else text[:_EXCERPT - 3] + "..."
