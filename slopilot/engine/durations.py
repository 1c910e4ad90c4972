"""Durations as a custom resource writes them (``90s``, ``2m``, ``1h30m``), read in
seconds: by the operator's spec parser and by the commands' seconds flags."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``"2m"`` -> 120.0, ``"1m30s"`` -> 90.0; a bad string raises ValueError."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 90s, 2m or 1h30m")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)
