"""``yaml.safe_load`` with bounds on what a small file may expand to.

Scenarios and cost profiles are YAML a user, or a tenant, hands in. ``safe_load`` builds
no objects, but it shares an aliased value rather than copying it, so a few hundred
bytes of aliases of aliases (a "billion laughs") load into 9**9 references to one
string, and the first ``str()`` or ``repr()`` of a field walks them all: minutes of CPU
and gigabytes before anything says why. Nesting a few thousand brackets deep overflows
the composer's recursion instead. Both are refused here, before any reader sees the
document, as a ``yaml.YAMLError`` (so each caller's "not valid YAML" handler names its
file).

A value whose text its type cannot hold is one too (``YAMLValueError``): PyYAML reads
``created: 2026-02-30`` as a date and ``datetime.date`` refuses the day, ``int`` refuses
5,000 digits, ``!!bool maybe`` is a KeyError. What the conversion raised went past every
``yaml.YAMLError`` handler and printed Python's words alone ("day is out of range for
month"), naming no file or field, and took the operator's daemon down with it.

A scenario may write its numbers as YAML 1.2 does, ``1e7`` or ``6e1``: PyYAML reads YAML
1.1, whose floats need a dot and a signed exponent (``1.0e+7``), and took those for the
text '1e7', refused as "expected a finite number" where the user meant a number
(``exponents=True``). Only there: a profile's hex hashes (``8e12``) are text, and PyYAML's
dumper writes them unquoted, judging by YAML 1.1.

A key given twice in one mapping is refused (``YAMLDuplicateKeyError``): PyYAML keeps
the last silently, so ``duration_s: 5`` appended to a scenario that said
``duration_s: 60`` ran 5 s, as a JSONL trace's object with a key twice is refused
(docs/traces.md). A key a merge (``<<: *base``) brings in and the mapping then sets is
no duplicate: that is how YAML says "this one, not the base's".
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from slopilot.engine.sim.quote import excerpt

MAX_VALUES = 100_000
"""Values a document may hold with every alias expanded; a scenario or a profile holds
a few hundred."""
MAX_DEPTH = 64
"""Levels of nesting; a scenario or a profile nests five."""


class YAMLShapeError(yaml.YAMLError):
    """A document too large with its aliases expanded, or nested too deep."""


class YAMLValueError(yaml.MarkedYAMLError):
    """A value whose text the type YAML gives it cannot hold (see the module docstring).

    Its message names the field (``model.shape.num_layers``, ``flags[0]``), the line and
    column, an excerpt of the text and the fix. ``field``, ``kind`` and the marks are
    there for a caller that must not quote the document (the operator's refusal of a
    ConfigMap that is no profile); ``root`` is the composed document, for one that needs
    to know what the document declares itself to be."""

    def __init__(self, field: str, kind: str, text: str, reason: str, node: yaml.Node,
                 root: yaml.Node) -> None:
        mark = node.start_mark
        self.field, self.kind, self.root = field, kind, root
        self.message = (f"{field} (line {mark.line + 1}, column {mark.column + 1}): "
                        f"{excerpt(text)} is no {kind} ({reason}); quote it to keep it "
                        f"text, or write a valid {kind}")
        super().__init__(problem=self.message, problem_mark=mark)

    def __str__(self) -> str:
        return self.message


class YAMLDuplicateKeyError(yaml.MarkedYAMLError):
    """A key given twice in one mapping (see the module docstring).

    Its message names the key by its path (``workload.arrivals.rate``), the line of
    each and the fix; ``field``, the marks (the second's is ``problem_mark``) and
    ``root`` are there for a caller that must not quote the document."""

    def __init__(self, field: str, first: yaml.Node, second: yaml.Node,
                 root: yaml.Node) -> None:
        self.field, self.root = field, root
        self.message = (f"{field} given twice (line {first.start_mark.line + 1}, then line "
                        f"{second.start_mark.line + 1}); YAML would keep only the last, "
                        "silently: keep the one you mean")
        super().__init__(context="the key first given", context_mark=first.start_mark,
                         problem=self.message, problem_mark=second.start_mark)

    def __str__(self) -> str:
        return self.message


class _Unconstructable(yaml.YAMLError):
    """Raised through the constructor's recursion with the node at fault."""

    def __init__(self, node: yaml.Node, cause: Exception) -> None:
        super().__init__(str(cause))
        self.node, self.cause = node, cause


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` whose constructors' own exceptions carry the node they failed on."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        # Whatever a constructor's conversion raises on hostile text: ValueError (a
        # date, an int past 4,300 digits), KeyError (!!bool), AttributeError (an explicit
        # !!timestamp that is none). Named by the node here, where it is known.
        except Exception as exc:
            raise _Unconstructable(node, exc) from exc


class _ExponentLoader(_BoundedLoader):
    """``SafeLoader`` that also reads YAML 1.2's plain exponent floats as numbers."""


# ASCII digits only, and only a plain scalar: a quoted '1e7' stays the text written.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+\Z")
_ExponentLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                                      list("-+0123456789."))


def safe_load_bounded(text: str, *, exponents: bool = False) -> Any:
    """``yaml.safe_load(text)``, refusing what expands past ``MAX_VALUES`` values or nests
    past ``MAX_DEPTH`` levels with a ``YAMLShapeError``; with ``exponents``, ``1e7`` is
    a number (see the module's docstring)."""
    loader = (_ExponentLoader if exponents else _BoundedLoader)(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLShapeError(f"nested deeper than Python can parse; {_FIX}") from None
        if node is None:
            return None
        _values(node, 0, {}, [False])
        _unique_keys(node)
        try:
            return loader.construct_document(node)
        except _Unconstructable as exc:
            raise _value_error(exc.node, exc.cause, node) from None
    finally:
        loader.dispose()


_REASON = 120
_KINDS = {"timestamp": "date", "int": "whole number", "float": "number",
          "bool": "boolean (true or false)", "binary": "base64 text", "null": "null"}


def _value_error(node: yaml.Node, cause: Exception, root: yaml.Node) -> YAMLValueError:
    tag = str(node.tag).rsplit(":", 1)[-1]
    text = node.value if isinstance(node, yaml.ScalarNode) else f"<a {tag}>"
    # Python's own fix (int's "use sys.set_int_max_str_digits()") is not the user's.
    reason = ("not a word YAML reads as one" if isinstance(cause, LookupError)
              else str(cause).split("; use ")[0] or type(cause).__name__)
    if len(reason) > _REASON:  # int's and float's own words quote the whole text
        reason = reason[:_REASON - 3] + "..."
    return YAMLValueError(_field_of(root, node) or "the document", _KINDS.get(tag, tag),
                          str(text), reason, node, root)


def _field_of(root: yaml.Node, target: yaml.Node) -> str | None:
    """The dotted path (``a.b[2]``) to ``target`` under ``root``; a key at fault is named
    by its mapping. Walked at most as far as ``_values`` allowed the document to go."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key is target:
                    return f"a key of {path}" if path else "a key"
                name = excerpt(key.value).strip("'") if isinstance(key, yaml.ScalarNode) \
                    else "?"
                stack.append((value, f"{path}.{name}" if path else name))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
    return None


_MERGE = "tag:yaml.org,2002:merge"


def _unique_keys(root: yaml.Node) -> None:
    """Refuse a mapping that gives one key twice. Keys are told apart as YAML types them
    (``1`` and ``'1'`` are two); a key that is itself a mapping or a list is left alone.
    Each node is walked once: ``_values`` has bounded the document, aliases included."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Node] = {}
            for key, value in node.value:
                name = excerpt(key.value).strip("'") if isinstance(key, yaml.ScalarNode) \
                    else "?"
                field = f"{path}.{name}" if path else name
                if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE:
                    earlier = first.setdefault((str(key.tag), key.value), key)
                    if earlier is not key:
                        raise YAMLDuplicateKeyError(field, earlier, key, root)
                stack.append((value, field))


_FIX = "write the document out plainly (a scenario or a profile nests a few levels)"


def _values(node: yaml.Node, depth: int, seen: dict[int, int], aliased: list[bool]) -> int:
    """The values under ``node`` with aliases expanded, each shared node counted once per
    reference but walked once (a cycle walks until ``MAX_DEPTH``); ``aliased[0]`` is set
    once a node is met twice (an alias)."""
    if depth > MAX_DEPTH:
        raise YAMLShapeError(f"nested deeper than {MAX_DEPTH} levels (or an alias refers to "
                             f"itself); {_FIX}")
    known = seen.get(id(node))
    if known is not None:
        aliased[0] = True
        return known
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1 + sum(_values(child, depth + 1, seen, aliased) for child in children)
    if total > MAX_VALUES and aliased[0]:
        raise YAMLShapeError(f"its aliases (*name) expand it to more than {MAX_VALUES:,} "
                             "values, which no scenario or profile needs; write the "
                             "repeated parts out instead of aliasing aliases")
    if total > MAX_VALUES:
        raise YAMLShapeError(f"it holds more than {MAX_VALUES:,} values, which no scenario "
                             "or profile needs; check that this is the file you meant")
    seen[id(node)] = total
    return total
