"""JSON that every parser reads: NaN and infinities written as ``null``.

Python's ``json`` writes a float NaN as a bare ``NaN`` (and infinity as ``Infinity``),
which is not JSON: ``JSON.parse``, jq and most other readers refuse the whole file. A
missing figure (a window with no requests) is NaN in slopilot's samples, so every file or
output meant for other programs goes through ``dumps``: a non-finite number becomes
``null``, and ``allow_nan=False`` makes any path that still slips one through fail here,
naming it, rather than in the reader.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float inside (dicts, lists, tuples) as None."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        f = float(value)  # numpy's floats too, which json cannot write as they are
        return f if math.isfinite(f) else None
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``value`` with NaN and infinities as ``null``."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
