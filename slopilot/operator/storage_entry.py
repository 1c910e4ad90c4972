"""One entry of the storage allow-list, read once at the start: what it names, and where
``{namespace}`` and ``*`` stand in it.

``{namespace}`` is the CR's namespace (study_storage.py): an entry holding it names each
namespace's own storage, never another's. So it may stand only where each namespace gets
a storage of its own: the database name (``postgresql://u@db/studies_{namespace}``) or
the SQLite file's path (``sqlite:////d/{namespace}.db``, ``sqlite:////d/{namespace}/*``),
once. In the host, user, port or query it would not separate anything (one server, the
same database), and an unknown ``{placeholder}`` is a typo that would otherwise match a
literal file name.

A ``*`` matches SQLite file names only: the whole name (``sqlite:////d/*``, any plain
name in the directory), or part of a name in a namespace's own directory
(``sqlite:////d/{namespace}/*.db``) or beside ``{namespace}`` (``sqlite:////d/{namespace}_*.db``).
Beside it, it must be set off from the namespace by a character no namespace holds
(``.`` or ``_``; a namespace is a DNS label, ``[a-z0-9-]``): with ``{namespace}-*.db``,
namespace team's ``team-*.db`` would take team-a's ``team-a-x.db``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import URL

from slopilot.tuner.study.storage_url import parse_storage_url, shown

NAMESPACE = "{namespace}"
NAMESPACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_BRACED = re.compile(r"\{[^{}/]*\}")
EXAMPLES = ("e.g. sqlite:////var/lib/slopilot/teams/{namespace}.db, "
            "sqlite:////var/lib/slopilot/teams/{namespace}_*.db or "
            "postgresql://optuna@db/studies_{namespace}")
_SHAPES = "expected sqlite:////..., postgresql://..., sqlite:////dir/* or *"


class EntryError(ValueError):
    """The entry cannot be read as the administrator meant; the message names it and the
    fix."""


Fail = Callable[[str], EntryError]


@dataclass(frozen=True)
class EntryShape:
    """An entry other than ``*``, as read."""

    url: URL
    """The entry parsed (its password too); ``{namespace}`` and ``*`` still in its
    database."""
    per_namespace: bool
    """Whether ``{namespace}`` stands in it."""
    files: tuple[str, str, str] | None
    """A SQLite entry with a ``*``: its directory, and its file name's text before and
    after the ``*`` (``{namespace}`` still in them); None for one database."""


def _with_password(entry: str, password: str | None) -> str | None:
    """``entry`` as written with its password replaced (None: dropped), or None where
    it holds none. Not rendered again as a URL (``shown``), which writes
    ``{namespace}`` and ``*`` as %7B...%7D and %2A."""
    scheme, sep, rest = entry.partition("://")
    userinfo, at, tail = rest.partition("@")
    user, colon, _ = userinfo.partition(":")
    if not sep or not at or not colon or "/" in user:  # no user:password@ before the host
        return None
    return f"{scheme}{sep}{user}{'' if password is None else ':' + password}{at}{tail}"


def shown_entry(entry: str) -> str:
    """``entry`` as written, its password (if any) as ***."""
    if "://" not in entry:
        return shown(entry)
    return _with_password(entry, "***") or entry


def entry_without_password(entry: str) -> str:
    """``entry`` as written, without its password (if any): the URL as a CR names it."""
    return _with_password(entry, None) or entry


def read_entry(entry: str, *, label: str | None = None) -> EntryShape:
    """``entry``'s shape; EntryError, naming it (``label``, else as an allow-list entry)
    and the fix, where it is not one."""
    named = label or f"storage allow-list entry {shown_entry(entry)!r}"

    def fail(why: str) -> EntryError:
        return EntryError(f"{named}: {why}")

    url = parse_storage_url(entry)
    if url is None:
        if "{" in entry:
            raise fail(f"a placeholder in the port, or no URL: {NAMESPACE} may stand only "
                       f"in the database name or the SQLite path, {EXAMPLES}")
        raise fail(_SHAPES)
    driver = url.drivername.split("+")[0]
    if driver not in ("sqlite", "postgresql"):
        raise fail(_SHAPES)
    for part, value in (("driver", url.drivername), ("user", url.username),
                        ("host", url.host),
                        ("query", " ".join(f"{k}={v}" for k, v in url.query.items()))):
        if value and ("{" in value or "}" in value):
            raise fail(f"a placeholder in the {part}: every namespace would share that "
                       f"server and database; {NAMESPACE} may stand only in the database "
                       f"name or the SQLite path, so that each namespace has its own, "
                       f"{EXAMPLES}")
    db = url.database or ""
    _check_braces(db, fail)
    per_namespace = NAMESPACE in db
    if driver == "sqlite" and db not in ("", ":memory:") and not db.startswith("/"):
        raise fail(f"the SQLite path {db!r} is relative to the operator's working "
                   f"directory: write sqlite:////{db.lstrip('./')} for /{db.lstrip('./')} "
                   "(four slashes: an absolute path)")
    if "*" in db:
        return EntryShape(url, per_namespace, _files(url, db, fail))
    if per_namespace and ".." in db.split("/"):
        raise fail(f"a path with .. in it: write the directory itself, {EXAMPLES}")
    return EntryShape(url, per_namespace, None)


def _check_braces(db: str, fail: Fail) -> None:
    """Only ``{namespace}``, once: any other ``{...}`` is a typo, a lone brace a
    placeholder half-written."""
    unknown = [m for m in _BRACED.findall(db) if m != NAMESPACE]
    if unknown:
        raise fail(f"unknown placeholder {unknown[0]}: the one placeholder is {NAMESPACE} "
                   f"(the CR's namespace), {EXAMPLES}")
    rest = _BRACED.sub("", db)
    if "{" in rest or "}" in rest:
        raise fail(f"a brace outside a placeholder: the one placeholder is {NAMESPACE}, "
                   f"written whole, {EXAMPLES}")
    if db.count(NAMESPACE) > 1:
        raise fail(f"{NAMESPACE} twice: use it once, in the directory or the file name, "
                   f"{EXAMPLES}")


def _files(url: URL, db: str, fail: Fail) -> tuple[str, str, str]:
    """A SQLite entry's directory and name around its ``*``, where the ``*`` stands
    right (module docstring)."""
    directory, _, name = db.rpartition("/")
    where = ("a * stands only in a SQLite file name: the whole name (sqlite:////dir/*: "
             f"any plain file in dir), or beside {NAMESPACE} "
             f"(sqlite:////dir/{NAMESPACE}_*.db)")
    if url.drivername != "sqlite" or url.host or url.username or url.port or url.query:
        raise fail(f"{where}; write a database whole, e.g. "
                   f"postgresql://optuna@db/studies_{NAMESPACE}, and a directory entry "
                   "as sqlite:////absolute/dir/* (no host, user or query)")
    if "*" in directory:
        raise fail(f"{where}, not in a directory: write the directory itself")
    if name.count("*") > 1:
        raise fail(f"{where}: one * per entry, e.g. sqlite:///{directory}/{NAMESPACE}_*.db")
    if ".." in directory.split("/"):
        raise fail("a directory entry is sqlite:////absolute/dir/* (four slashes: an "
                   "absolute path, no ..)")
    before, _, after = name.partition("*")
    if NAMESPACE in name:
        # The character between the namespace and the *, on the *'s side.
        beside = (before.split(NAMESPACE, 1)[1][:1] if NAMESPACE in before
                  else after.split(NAMESPACE, 1)[0][-1:])
        if not beside or beside in NAMESPACE_CHARS:
            raise fail(
                f"the * may take part of another namespace's name: a namespace holds "
                f"[a-z0-9-], so with {name!r} namespace team's names would take team-a's "
                f"(team-a-x): set {NAMESPACE} off from the * with '.' or '_', e.g. "
                f"sqlite:///{directory}/{NAMESPACE}_*.db, or give each namespace a "
                f"directory, sqlite:///{directory}/{NAMESPACE}/*")
    elif name != "*" and NAMESPACE not in directory:
        raise fail(f"{where}: write sqlite:////dir/* for any file of dir, or give each "
                   f"namespace names of its own, {EXAMPLES}")
    return directory, before, after
