"""A saved state's values held against the types its dataclass declares.

The state lives in the LLMDeployment's status, anyone's with status rights to write:
``check_fields`` names the field and what it expected for anything else, rather than
letting a TypeError escape from deep inside a tick.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from slopilot.engine.sim.quote import excerpt
from slopilot.tuner.loop.errors import ControllerError

_HINTS: dict[type, dict[str, Any]] = {}

MAX_STATE_TEXT = 2048
"""The most characters a text of a saved state is read back with: the longest the loop
writes (a reason naming an API error) is a few hundred."""

# What would start a line of its own, or paint one, in a log or an event: C0 and C1
# controls and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

_MAY_BE_NEGATIVE = frozenset({"edge_constraints"})
"""The numbers of the state that may be below zero (a constraint below zero held). Every
other is a count, a trial number, goodput or a clock reading: below zero, a count let an
episode run past ``max_trials`` (-1000: 1020 trials) and a trial's window be rejected
past ``max_window_repeats``, and a time was no reading of any clock the loop runs on."""


def check_fields(cls: type, values: Mapping[str, Any], prefix: str,
                  skip: tuple[str, ...] = ()) -> None:
    """Each of ``values`` of the type ``cls`` declares for it (numbers finite, and none
    below zero but ``_MAY_BE_NEGATIVE``'s)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    for name, value in values.items():
        hint = _HINTS[cls].get(name)
        if name in skip or hint is None:
            continue
        if not _conforms(value, hint):
            raise ControllerError(f"controller state: {prefix}{name}={excerpt(value)}: "
                                  f"expected {_type_name(hint)}")
        if name not in _MAY_BE_NEGATIVE and _below_zero(value):
            raise ControllerError(f"controller state: {prefix}{name}={excerpt(value)}: "
                                  "expected >= 0 (a count, a trial number, goodput or a "
                                  "time)")


def _below_zero(value: Any) -> bool:
    """Whether ``value`` (as ``_conforms`` passed it) is, or lists, a number below zero;
    a config's knobs (a mapping) are the engine's config to judge."""
    if isinstance(value, list):
        return any(_below_zero(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if origin is dict:
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    return True  # a type of its own (an enum, a dataclass): judged where it is built


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    names = {float: "a finite number", int: "a whole number", str: "a string",
             bool: "true or false", type(None): "null"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return {float: "a list of numbers", str: "a list of strings"}.get(item, "a list")
    return {dict: "a mapping"}.get(origin, str(hint))


def one_line(text: str) -> str:
    """``text`` as a saved state's text is read back: its control characters escaped as
    Python writes them (``\\n``), and cut to ``MAX_STATE_TEXT`` characters, saying how
    long it was. The state's texts go into decisions' reasons, the operator's log and
    events; a forged one wrote a line of its own into the shared log."""
    flat = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    if len(flat) <= MAX_STATE_TEXT:
        return flat
    tail = f"... ({len(flat)} characters)"
    return flat[:MAX_STATE_TEXT - len(tail)] + tail


def texts_read(value: Any) -> Any:
    """``value`` with every text in it, nested in mappings and lists, read back by
    ``one_line`` (keys are left to the fields' own checks)."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, Mapping):
        return {k: texts_read(v) for k, v in value.items()}
    if isinstance(value, list):
        return [texts_read(v) for v in value]
    return value
