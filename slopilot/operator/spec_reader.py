"""Typed values out of a custom resource's nested dicts, collecting problems instead of
raising, so that one status condition can list every bad field at once."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from slopilot.engine.durations import parse_duration
from slopilot.engine.sim.quote import excerpt


class SpecReader:
    """Reads typed values out of nested dicts, collecting problems instead of raising."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def get(self, data: Mapping[str, Any], path: str, kind: type | tuple[type, ...],
            default: Any = None) -> Any:
        """The value at ``path`` (``spec.a.b``, read from ``data`` = the spec), or
        ``default`` where it is absent. A section on the way that is not a mapping is
        named once as a problem, not read as absent (nothing below it would count)."""
        node: Any = data
        parts = path.split(".")
        for depth, part in enumerate(parts[1:], start=1):
            if node is not None and not isinstance(node, Mapping):
                where = ".".join(parts[:depth])
                problem = f"{where}={excerpt(node)}: expected a mapping"
                if problem not in self.problems:
                    self.problems.append(problem)
                return default
            node = node.get(part) if node is not None else None
        if node is None:
            return default
        if isinstance(node, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            node = None
        if not isinstance(node, kind):
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            self.problems.append(f"{path}={excerpt(node)}: expected {names}")
            return default
        return node

    def duration(self, data: Mapping[str, Any], path: str) -> tuple[str, float] | None:
        """The duration at ``path`` as written and in seconds; None where it is absent,
        or no duration (a problem then names it)."""
        text = self.get(data, path, str)
        if text is None:
            return None
        try:
            return text, parse_duration(text)
        except ValueError as exc:
            self.problems.append(f"{path}: {exc}")
            return None

    def choice(self, data: Mapping[str, Any], path: str, enum_type: type[enum.Enum],
               default: enum.Enum) -> Any:
        raw = self.get(data, path, str)
        if raw is None:
            return default
        try:
            return enum_type(raw)
        except ValueError:
            allowed = ", ".join(str(e.value) for e in enum_type)
            self.problems.append(f"{path}={raw!r} is not allowed; use one of: {allowed}")
            return default

