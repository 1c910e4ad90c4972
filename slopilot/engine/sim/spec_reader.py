"""Strict reading of scenario YAML: every error names the file, the field, the value and the fix.

A ``Reader`` wraps one mapping of the document and remembers which keys were read, so
``finish()`` can refuse the leftovers (typos) with a did-you-mean instead of silently
ignoring them.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slopilot.engine.sim.quote import excerpt


class ScenarioError(ValueError):
    """A scenario or workload description is invalid; the message says where and how to fix it."""


_MISSING: Any = object()
MAX_TEXT = 1024
"""Characters of a text field (a name, a path): what reads it quotes it on (status, a
summary), and a name of 100,000 characters went whole into an operator's CR status."""


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """``did you mean 'x'? `` when a choice is close to ``word``, else nothing: the caller
    lists the choices itself, once."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


class Reader:
    """Typed, bounded access to one mapping of a YAML document."""

    def __init__(self, data: object, *, source: str, path: str = "",
                 files: list[Path] | None = None) -> None:
        self.source = source
        self.path = path
        # The files the document names that its parse read (a trace, a profile): one
        # list for all the readers of a document, so that a command refuses to write
        # over any of them (``run_inputs``), wherever in the document it was named.
        self.files: list[Path] = [] if files is None else files
        if not isinstance(data, Mapping):
            where = path or "the document"
            got = "nothing" if data is None else f"{type(data).__name__} {excerpt(data)}"
            raise ScenarioError(f"{source}: {where} must be a mapping of key: value, got {got}")
        for key in data:
            if not isinstance(key, str):
                raise ScenarioError(
                    f"{source}: {self.qualify(str(key))}: keys must be strings, got {key!r}")
        self.data: Mapping[str, Any] = data
        self._used: set[str] = set()

    def qualify(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, value: object, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {self.qualify(key)}={excerpt(value)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._used.add(key)
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            unread = [k for k in self.data if k not in self._used]
            typo = difflib.get_close_matches(key, unread, n=1, cutoff=0.6)
            hint = f" (is {typo[0]!r} a typo for it?)" if typo else ""
            raise ScenarioError(
                f"{self.source}: {self.qualify(key)} is required but missing; add it{hint}")
        return default

    def integer(self, key: str, default: Any = _MISSING, *, lo: int | None = None,
            hi: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.error(key, value, "expected a whole number" + _unquote(value))
        self._check_bounds(key, value, lo, hi)
        return value

    def number(self, key: str, default: Any = _MISSING, *, lo: float | None = None,
              hi: float | None = None, lo_open: bool = False) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise self.error(key, value, "expected a finite number" + _unquote(value))
        if lo_open and lo is not None and value <= lo:
            raise self.error(key, value, f"must be greater than {lo}")
        self._check_bounds(key, value, lo, hi)
        return float(value)

    def optional_float(self, key: str, *, lo: float | None = None, hi: float | None = None,
                       lo_open: bool = False) -> float | None:
        if self.raw(key, None) is None:
            return None
        return self.number(key, lo=lo, hi=hi, lo_open=lo_open)

    def optional_int(self, key: str, *, lo: int | None = None,
                     hi: int | None = None) -> int | None:
        if self.raw(key, None) is None:
            return None
        return self.integer(key, lo=lo, hi=hi)

    def text(self, key: str, default: Any = _MISSING, *,
            choices: tuple[str, ...] | None = None, max_chars: int = MAX_TEXT) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, value, "expected a non-empty string")
        if len(value) > max_chars:
            raise self.error(key, value, f"{len(value):,} characters; at most {max_chars:,}")
        if choices is not None and value not in choices:
            raise self.error(key, value, f"not allowed; {did_you_mean(value, choices)}"
                             f"use one of: {', '.join(choices)}")
        return value

    def sub(self, key: str, *, optional: bool = False) -> Reader | None:
        """The nested mapping under ``key``; None if optional and absent or null."""
        value = self.raw(key, None if optional else _MISSING)
        if value is None and optional:
            return None
        return Reader(value, source=self.source, path=self.qualify(key), files=self.files)

    def section(self, key: str) -> Reader:
        """The required nested mapping under ``key``."""
        return Reader(self.raw(key), source=self.source, path=self.qualify(key),
                      files=self.files)

    def child(self, key: str, value: object) -> Reader:
        """A reader for a value already taken out with ``raw``."""
        return Reader(value, source=self.source, path=self.qualify(key), files=self.files)

    def finish(self, *, extra_known: tuple[str, ...] = ()) -> None:
        """Refuse keys nobody read: they are typos or fields from another version."""
        known = sorted(self._used | set(extra_known))
        for key in self.data:
            if key not in self._used and key not in extra_known:
                raise ScenarioError(
                    f"{self.source}: {self.qualify(key)}: unknown key; "
                    f"{did_you_mean(key, known)}allowed here: {', '.join(known)}")

    def _check_bounds(self, key: str, value: float, lo: float | None, hi: float | None) -> None:
        if lo is not None and value < lo:
            raise self.error(key, value, f"must be at least {lo}")
        if hi is not None and value > hi:
            raise self.error(key, value, f"must be at most {hi}")


def _unquote(value: object) -> str:
    """The fix for a number written in quotes (YAML's text, not its number)."""
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return ""
        if math.isfinite(number) and value.strip().isascii():
            return "; write it without quotes"
    return ""
