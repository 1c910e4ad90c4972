"""Which Optuna storage a CR author may put its study in: the administrator's list.

``spec.tuning.storage`` is written by a tenant, but the operator opens it with its own
network reach and file system: left open, a CR could point the operator at any database
it can reach (a port scan with error messages for answers) or create SQLite files
anywhere its pod can write. So the administrator lists the storages tenants may use
(``$SLOPILOT_ALLOWED_STORAGE``, comma-separated; the default: the operator's own
``sqlite:////var/lib/slopilot/study.db``):

- a database URL, compared as a database (driver, user, host, port, database, query;
  never the password). The entry may carry the password, so a CR names a shared
  PostgreSQL without it and the operator connects with the administrator's credentials;
- ``sqlite:///DIR/*``: any SQLite file directly inside DIR (a plain file name: no
  sub-directory, no ``..``), so each team can keep its own file;
- ``*``: any URL (a single-tenant cluster).

A CR's URL may never hold a password: whoever can read the CR could read it. Nor may a
SQLite path be relative (``sqlite:///x.db``, three slashes): it would resolve against the
operator's working directory, which neither the CR's author nor the admin sees. Nor may it
name one of the files SQLite keeps beside a database (``<db>-journal``, ``-wal``,
``-shm``, ``-mj...``; ``sqlite_sidecar_problem``): a directory entry allows any plain
name, and a database created in another's journal (the operator's own ``study.db``,
every tenant's default, where the directory is the operator's) is a hot journal to
SQLite: every connection to that database must roll it back under an exclusive lock
before it reads (a read-only one cannot, and fails), and the rollback deletes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy.engine import URL, make_url

from slopilot.tuner.study.storage_url import parse_storage_url, shown

ALLOW_ALL = "*"
MAX_STUDY_STORAGES = 8
"""How many storages ``status.studyStorages`` keeps (the newest; study_cleanup.py): a
study switched through more storages than this may stay in the oldest."""
_SQLITE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SQLITE_SIDECAR = r"-(journal|wal|shm|mj[0-9A-Fa-f]+)$"
"""The suffixes of the files SQLite keeps beside a database file (rollback journal, WAL,
its shared-memory index, a super-journal: sqlite.org/tempfiles.html)."""
SIDECAR_RULE = ("!self.matches('^sqlite[^:]*://[^?]*" + SQLITE_SIDECAR[:-1]
                + "([?].*)?$')")
"""``sqlite_sidecar_problem``'s rule for the CRD's schema (on the whole URL: a query
follows the path)."""
SIDECAR_MESSAGE = ("names a file SQLite keeps beside a database (<db>-journal, -wal, -shm, "
                   "-mj...), not a database: name a database file, e.g. "
                   "sqlite:////var/lib/slopilot/team-a.db")
_SIDECAR = re.compile(SQLITE_SIDECAR)


class StorageRefused(ValueError):
    """The URL is not one the administrator allows; the message names the fix."""


def _identity(url: URL) -> tuple[object, ...]:
    return (url.drivername, url.username, (url.host or "").lower(), url.port, url.database,
            tuple(sorted((k, str(v)) for k, v in url.query.items())))


@dataclass(frozen=True)
class StorageRule:
    """One entry of the administrator's list, checked when the operator starts."""

    entry: str

    def __post_init__(self) -> None:
        if self.entry == ALLOW_ALL:
            return
        if self.entry.endswith("/*"):
            directory = self.entry[:-2]
            if not directory.startswith("sqlite:////") or ".." in directory.split("/"):
                raise StorageRefused(
                    f"storage allow-list entry {self.entry!r}: a directory entry is "
                    "sqlite:////absolute/dir/* (four slashes: an absolute path, no ..)")
            return
        parsed = parse_storage_url(self.entry)
        if parsed is None or parsed.drivername.split("+")[0] not in ("sqlite", "postgresql"):
            raise StorageRefused(f"storage allow-list entry {shown(self.entry)!r}: expected "
                                 "sqlite:////..., postgresql://..., sqlite:////dir/* or *")
        if (problem := _relative_sqlite(parsed)) is not None:
            raise StorageRefused(f"storage allow-list entry {shown(self.entry)!r}: {problem}")

    def resolve(self, wanted: URL, url: str) -> str | None:
        """The URL to open for ``wanted`` (the admin's, with its password), or None."""
        if self.entry == ALLOW_ALL:
            return url
        if self.entry.endswith("/*"):
            directory = self.entry[len("sqlite:///"):-2]
            db = wanted.database or ""
            head, _, name = db.rpartition("/")
            if (wanted.drivername == "sqlite" and not wanted.query and not wanted.host
                    and not wanted.username and head == directory
                    and _SQLITE_FILE.fullmatch(name) and name not in (".", "..")):
                return url
            return None
        allowed = make_url(self.entry)
        return self.entry if _identity(allowed) == _identity(wanted) else None


def _relative_sqlite(url: URL) -> str | None:
    db = url.database or ""
    if url.drivername.split("+")[0] != "sqlite" or db.startswith("/") or db in ("", ":memory:"):
        return None
    return (f"the SQLite path {db!r} is relative to the operator's working directory: "
            f"write sqlite:////{db.lstrip('./')} for /{db.lstrip('./')} (four slashes: an "
            "absolute path)")


def sqlite_sidecar_problem(url: str) -> str | None:
    """Why ``url`` (``spec.tuning.storage``) names no database but one of the files SQLite
    keeps beside one (module docstring), or None."""
    parsed = parse_storage_url(url)
    if parsed is None or parsed.drivername.split("+")[0] != "sqlite":
        return None
    head, _, name = (parsed.database or "").rpartition("/")
    if (m := _SIDECAR.search(name)) is None:
        return None
    return (f"spec.tuning.storage={shown(url)!r} names SQLite's own {m.group(1)} file of "
            f"the database {name[:m.start()]!r}, which SQLite writes and deletes with that "
            "database's transactions, not a database: name a database file, e.g. "
            f"{parsed.drivername}:///{head}/team-a.db")


def resolve_storage(url: str, rules: tuple[StorageRule, ...]) -> str:
    """The storage URL the operator opens for a CR that asks for ``url``.

    Raises StorageRefused naming ``spec.tuning.storage`` and the fix."""
    parsed = parse_storage_url(url)
    if parsed is None:
        raise StorageRefused(f"spec.tuning.storage={url[:80]!r} is not a database URL: use "
                             "sqlite:////abs/path/study.db or postgresql://user@host/db")
    if parsed.password:
        raise StorageRefused(
            f"spec.tuning.storage={shown(url)!r} holds a password, which everyone who can "
            "read the LLMDeployment can read: name the database without it; the cluster "
            "admin puts the credentials in the operator's SLOPILOT_ALLOWED_STORAGE")
    if (problem := _relative_sqlite(parsed)) is not None:
        raise StorageRefused(f"spec.tuning.storage={shown(url)!r}: {problem}")
    if (problem := sqlite_sidecar_problem(url)) is not None:
        raise StorageRefused(problem)
    for rule in rules:
        if (target := rule.resolve(parsed, url)) is not None:
            return target
    listing = ", ".join(shown(r.entry) for r in rules) or "empty"
    raise StorageRefused(
        f"spec.tuning.storage={shown(url)!r} is not on the operator's storage allow-list "
        f"({listing}): use an allowed storage, or ask the cluster admin to add it to "
        "SLOPILOT_ALLOWED_STORAGE")
