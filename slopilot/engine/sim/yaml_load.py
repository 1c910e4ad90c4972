"""``yaml.safe_load`` with bounds on what a small file may expand to.

Scenarios and cost profiles are YAML a user, or a tenant, hands in. ``safe_load`` builds
no objects, but it shares an aliased value rather than copying it, so a few hundred
bytes of aliases of aliases (a "billion laughs") load into 9**9 references to one
string, and the first ``str()`` or ``repr()`` of a field walks them all: minutes of CPU
and gigabytes before anything says why. Nesting a few thousand brackets deep overflows
the composer's recursion instead. Both are refused here, before any reader sees the
document, as a ``yaml.YAMLError`` (so each caller's "not valid YAML" handler names its
file).

A scenario may write its numbers as YAML 1.2 does, ``1e7`` or ``6e1``: PyYAML reads YAML
1.1, whose floats need a dot and a signed exponent (``1.0e+7``), and took those for the
text '1e7', refused as "expected a finite number" where the user meant a number
(``exponents=True``). Only there: a profile's hex hashes (``8e12``) are text, and PyYAML's
dumper writes them unquoted, judging by YAML 1.1.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_VALUES = 100_000
"""Values a document may hold with every alias expanded; a scenario or a profile holds
a few hundred."""
MAX_DEPTH = 64
"""Levels of nesting; a scenario or a profile nests five."""


class YAMLShapeError(yaml.YAMLError):
    """A document too large with its aliases expanded, or nested too deep."""


class _ExponentLoader(yaml.SafeLoader):
    """``SafeLoader`` that also reads YAML 1.2's plain exponent floats as numbers."""


# ASCII digits only, and only a plain scalar: a quoted '1e7' stays the text written.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")
_ExponentLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                                      list("-+0123456789."))


def safe_load_bounded(text: str, *, exponents: bool = False) -> Any:
    """``yaml.safe_load(text)``, refusing what expands past ``MAX_VALUES`` values or nests
    past ``MAX_DEPTH`` levels with a ``YAMLShapeError``; with ``exponents``, ``1e7`` is
    a number (see the module's docstring)."""
    loader = (_ExponentLoader if exponents else yaml.SafeLoader)(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLShapeError(f"nested deeper than Python can parse; {_FIX}") from None
        if node is None:
            return None
        _values(node, 0, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()


_FIX = "write the document out plainly (a scenario or a profile nests a few levels)"


def _values(node: yaml.Node, depth: int, seen: dict[int, int]) -> int:
    """The values under ``node`` with aliases expanded, each shared node counted once per
    reference but walked once (a cycle walks until ``MAX_DEPTH``)."""
    if depth > MAX_DEPTH:
        raise YAMLShapeError(f"nested deeper than {MAX_DEPTH} levels (or an alias refers to "
                             f"itself); {_FIX}")
    known = seen.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1 + sum(_values(child, depth + 1, seen) for child in children)
    if total > MAX_VALUES:
        raise YAMLShapeError(f"its aliases (*name) expand it to more than {MAX_VALUES:,} "
                             "values, which no scenario or profile needs; write the "
                             "repeated parts out instead of aliasing aliases")
    seen[id(node)] = total
    return total
