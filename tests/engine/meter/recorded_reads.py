"""What code reads of a ``json.loads`` value, recorded as it reads it.

``recorded(value, reads)`` is the value made of containers that log each read into
``reads``: an object's key looked up (``[]``, ``get``, ``in``), an array's item taken
(``[]``, iterating it) or its length (``len``, its truth), and anything else (``items()``,
``keys()``, an object's length or truth, ``==``, a copy) as all of the container. Each
read is logged with what it saw, so two runs of the same code on two values read the
same where their logs are equal; and each at its place (``path``: keys and indexes), so
what it needs of a value is known whatever the value held (a key read where it is absent
is a read all the same).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from typing import Any, SupportsIndex

from slopilot.engine.meter.json_steps import WHOLE, Keep

Path = tuple[str | int, ...]
"""Keys (of objects) and indexes (of arrays) from the value's top."""


class Kind(enum.StrEnum):
    KEY = "key"
    """Whether an object has a key, or an array an index, and what is there (a scalar's
    value, a container's kind)."""
    COUNT = "count"
    """An array's length."""
    ALL = "all"
    """All of a container."""


@dataclasses.dataclass(frozen=True)
class Read:
    path: Path
    kind: Kind
    saw: Any

    def shape(self) -> tuple[str, ...]:
        """The path with each index as ``[]``: the place, whichever item."""
        return tuple("[]" if isinstance(step, int) else step for step in self.path)

    def __str__(self) -> str:
        return f"{_shown(self.shape())} ({self.kind})"


class Reads(list[Read]):
    def key(self, path: Path, present: bool, value: Any) -> None:
        self.append(Read(path, Kind.KEY, (present, _seen(value)) if present else False))


def recorded(value: Any, reads: Reads, path: Path = ()) -> Any:
    """``value`` (a ``json.loads`` one) of containers that log each read into ``reads``."""
    if isinstance(value, dict):
        return _Object({k: recorded(v, reads, (*path, k)) for k, v in value.items()},
                       reads, path)
    if isinstance(value, list):
        return _Array([recorded(v, reads, (*path, i)) for i, v in enumerate(value)],
                      reads, path)
    return value


def plain(value: Any) -> Any:
    """``value`` without its recording: what a read of all of it saw."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [plain(v) for v in list.__iter__(value)]
    return value


def _seen(value: Any) -> Any:
    """What a read of a place saw: a container's kind (its reads are its own), a scalar
    by its type and value (``1``, ``1.0`` and ``True`` are equal)."""
    if isinstance(value, dict | list):
        return "object" if isinstance(value, dict) else "array"
    return type(value).__name__, value


class _Object(dict[str, Any]):
    __slots__ = ("_path", "_reads")

    def __init__(self, items: dict[str, Any], reads: Reads, path: Path) -> None:
        super().__init__(items)
        self._reads, self._path = reads, path

    def _key(self, key: Any) -> None:
        present = dict.__contains__(self, key)
        self._reads.key((*self._path, key), present,
                        dict.__getitem__(self, key) if present else None)

    def _all(self) -> None:
        self._reads.append(Read(self._path, Kind.ALL, plain(self)))

    def __getitem__(self, key: str) -> Any:
        self._key(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._key(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._key(key)
        return super().__contains__(key)


class _Array(list[Any]):
    __slots__ = ("_path", "_reads")

    def __init__(self, items: list[Any], reads: Reads, path: Path) -> None:
        super().__init__(items)
        self._reads, self._path = reads, path

    def _item(self, index: int) -> Any:
        value = list.__getitem__(self, index)
        self._reads.key((*self._path, index), True, value)
        return value

    def _all(self) -> None:
        self._reads.append(Read(self._path, Kind.ALL, plain(self)))

    def __len__(self) -> int:
        n = super().__len__()
        self._reads.append(Read(self._path, Kind.COUNT, n))
        return n

    def __iter__(self) -> Iterator[Any]:
        index = 0
        while index < list.__len__(self):
            yield self._item(index)
            index += 1

    def __getitem__(self, index: SupportsIndex | slice) -> Any:
        n = list.__len__(self)
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(n))]
        i = index.__index__()
        if not -n <= i < n:
            self._reads.key((*self._path, i), False, None)
            raise IndexError(i)
        return self._item(i % n)


def _reading_all(cls: type, base: type, names: tuple[str, ...]) -> None:
    """``cls``'s ``names``: ``base``'s, each logged as a read of all of the container."""
    def reading_all(method: Any) -> Any:
        def reads_all(self: Any, *args: Any, **kwargs: Any) -> Any:
            self._all()
            return method(self, *args, **kwargs)
        reads_all.__name__ = reads_all.__qualname__ = method.__name__
        return reads_all

    for name in names:
        setattr(cls, name, reading_all(getattr(base, name)))


_reading_all(_Object, dict, ("__len__", "__iter__", "keys", "values", "items", "__eq__",
                             "__ne__", "copy", "__or__", "__ror__", "__reversed__"))
_reading_all(_Array, list, ("__contains__", "__reversed__", "__eq__", "__ne__", "__lt__",
                            "__add__", "__mul__", "copy", "index", "count"))


def kept(keep: Keep, read: Read) -> bool:
    """Whether what ``keep`` keeps of a value (``json_steps``) holds all ``read`` saw,
    whatever the value: an object's key kept (or the object whole), an array's items
    kept (its ``count`` alone keeps none), the container read all kept whole. A value of
    another kind than its place's ``Keep`` says is kept whole (``json_steps.Keep``)."""
    for step in read.path:
        if isinstance(step, int):
            if keep.count:
                return False
            if keep.items is None:
                return True
            keep = keep.items
        else:
            if keep.keys is None:
                return True
            if step not in keep.keys:
                return False
            keep = keep.keys[step]
    if read.kind is not Kind.ALL:
        return True  # a place's presence and kind, an array's length: kept by any Keep
    if isinstance(read.saw, dict):
        return keep.keys is None
    return not keep.count and keep.items in (None, WHOLE)


def places(keep: Keep, at: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Each place ``keep`` names, as ``Read.shape`` writes it."""
    yield at
    for key, inner in (keep.keys or {}).items():
        yield from places(inner, (*at, key))
    if keep.items is not None:
        yield from places(keep.items, (*at, "[]"))


def _shown(shape: tuple[str, ...]) -> str:
    return "".join(step if step == "[]" else f".{step}" for step in shape).lstrip(".") or "."
