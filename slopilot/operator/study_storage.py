"""Which Optuna storage a CR author may put its study in: the administrator's list.

``spec.tuning.storage`` is written by a tenant, but the operator opens it with its own
network reach and file system: left open, a CR could point the operator at any database
it can reach (a port scan with error messages for answers) or create SQLite files
anywhere its pod can write. So the administrator lists the storages tenants may use
(``$SLOPILOT_ALLOWED_STORAGE``, comma-separated; the default: the default storage of a
CR that names none, default_storage.py, the operator's own
``sqlite:////var/lib/slopilot/study.db`` unless the administrator names another):

- a database URL, compared as a database (driver, user, host, port, database, query;
  never the password). The entry may carry the password, so a CR names a shared
  PostgreSQL without it and the operator connects with the administrator's credentials;
- ``sqlite:///DIR/*``: any SQLite file directly inside DIR (a plain file name: no
  sub-directory, no ``..``);
- ``*``: any URL (a single-tenant cluster).

Such an entry is the same for every namespace: with ``sqlite:////d/teams/*`` a tenant of
team-a may name ``teams/team-b.db``, and the operator opens team-b's file with its own
rights and creates team-a's study there (writes, locks, growth in another team's file).
So an entry may hold ``{namespace}``, which stands for the CR's namespace wherever a
storage is resolved (``resolve_storage``: the CR's validation, its study, the cleanup at
its deletion, the reclaim at start for each recorded namespace), so that it matches that
namespace's own storages only: ``sqlite:////d/teams/{namespace}.db``,
``sqlite:////d/{namespace}/*``, ``sqlite:////d/teams/{namespace}_*.db``,
``postgresql://u@db/studies_{namespace}`` (storage_entry.py: where it may stand). A URL
refused as another namespace's says so, from its own text and the entry (nothing is
opened to tell), and names the storage the CR's namespace may use.

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
from dataclasses import dataclass, field

from sqlalchemy.engine import URL

from slopilot.operator.storage_entry import (
    NAMESPACE,
    EntryError,
    EntryShape,
    read_entry,
    shown_entry,
)
from slopilot.operator.validation import DNS_1123_LABEL
from slopilot.tuner.study.storage_url import parse_storage_url, shown

ALLOW_ALL = "*"
MAX_STUDY_STORAGES = 8
"""How many storages ``status.studyStorages`` keeps (the newest; study_cleanup.py): a
study switched through more storages than this may stay in the oldest."""
_SQLITE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_FILE_CHARS = "[A-Za-z0-9._-]*"
_NAMESPACE_GROUP = "(?P<namespace>[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)"
"""A namespace's name (a DNS label), in ``StorageRule.claimed``'s pattern."""
PG_NAME_BYTES = 63
"""The longest database name PostgreSQL keeps (NAMEDATALEN - 1): a longer one is cut."""
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
    """One entry of the administrator's list, checked when the operator starts
    (storage_entry.py: where ``{namespace}`` and ``*`` may stand)."""

    entry: str
    shape: EntryShape | None = field(init=False, repr=False, compare=False, default=None)
    """None for ``*``."""

    def __post_init__(self) -> None:
        if self.entry == ALLOW_ALL:
            return
        try:
            object.__setattr__(self, "shape", read_entry(self.entry))
        except EntryError as exc:
            raise StorageRefused(str(exc)) from None

    @property
    def per_namespace(self) -> bool:
        """Whether the entry names each namespace's own storage (``{namespace}``)."""
        return self.shape is not None and self.shape.per_namespace

    @property
    def one_database(self) -> bool:
        """Whether the entry names one database, the same for every namespace."""
        return self.shape is not None and not self.shape.per_namespace \
            and self.shape.files is None

    def applied(self, namespace: str) -> str:
        """The entry as it applies to a CR of ``namespace`` (with its password: show it
        through ``shown_entry``)."""
        if self.shape is None or not self.shape.per_namespace:
            return self.entry
        if self.shape.files is not None:  # sqlite:////dir/...*...: no password, no query
            return "sqlite:///" + (self.shape.url.database or "").replace(NAMESPACE, namespace)
        return _target(self.shape, namespace).render_as_string(hide_password=False)

    def unusable_in(self, namespace: str) -> str | None:
        """Why the entry gives ``namespace`` no storage, or None. PostgreSQL cuts a
        database name to 63 bytes as a client connects: two long namespaces would meet
        in one database."""
        if not self.per_namespace or self.shape is None or self.shape.files is not None:
            return None
        if not self.shape.url.drivername.startswith("postgresql"):
            return None
        name = _target(self.shape, namespace).database or ""
        if len(name.encode()) <= PG_NAME_BYTES:
            return None
        return (f"the allow-list entry {shown_entry(self.entry)!r} makes the database name "
                f"{name!r} for namespace {namespace}, longer than the {PG_NAME_BYTES} bytes "
                "PostgreSQL keeps of a name (it would cut it, and two namespaces could "
                "meet in one database): ask the cluster admin for an entry with less text "
                f"around {NAMESPACE}")

    def resolve(self, wanted: URL, url: str, namespace: str) -> str | None:
        """The URL to open for ``wanted`` (the admin's, with its password) in a CR of
        ``namespace``, or None."""
        if self.shape is None:
            return url
        if self.shape.per_namespace and (not DNS_1123_LABEL.fullmatch(namespace)
                                         or self.unusable_in(namespace) is not None):
            return None
        if self.shape.files is not None:
            directory, before, after = (s.replace(NAMESPACE, namespace)
                                        for s in self.shape.files)
            head, _, name = (wanted.database or "").rpartition("/")
            if (wanted.drivername == "sqlite" and not wanted.query and not wanted.host
                    and not wanted.username and wanted.port is None and head == directory
                    and _SQLITE_FILE.fullmatch(name) and name not in (".", "..")
                    and len(name) >= len(before) + len(after)
                    and name.startswith(before) and name.endswith(after)):
                return url
            return None
        if not self.shape.per_namespace:
            return self.entry if _identity(self.shape.url) == _identity(wanted) else None
        target = _target(self.shape, namespace)
        if _identity(target) != _identity(wanted):
            return None
        return target.render_as_string(hide_password=False)

    def claimed(self, wanted: URL) -> str | None:
        """The namespace whose storage ``wanted``'s database is, by this entry's
        ``{namespace}`` (its other parts unchecked), or None. Text only: nothing is
        opened or looked up."""
        if not self.per_namespace or self.shape is None:
            return None
        pattern = re.escape(self.shape.url.database or "").replace(
            re.escape(NAMESPACE), _NAMESPACE_GROUP).replace(re.escape("*"), _FILE_CHARS)
        found = re.fullmatch(pattern, wanted.database or "")
        return None if found is None else found["namespace"]


def _target(shape: EntryShape, namespace: str) -> URL:
    """A one-database entry's URL for ``namespace``: its database with it filled in."""
    return shape.url.set(database=(shape.url.database or "").replace(NAMESPACE, namespace))


def _relative_sqlite(url: URL) -> str | None:
    db = url.database or ""
    if url.drivername.split("+")[0] != "sqlite" or db.startswith("/") or db in ("", ":memory:"):
        return None
    return (f"the SQLite path {db!r} is relative to the operator's working directory: "
            f"write sqlite:////{db.lstrip('./')} for /{db.lstrip('./')} (four slashes: an "
            "absolute path)")


def sqlite_sidecar_problem(url: str, field: str = "spec.tuning.storage") -> str | None:
    """Why ``url`` (``field``'s value) names no database but one of the files SQLite
    keeps beside one (module docstring), or None."""
    parsed = parse_storage_url(url)
    if parsed is None or parsed.drivername.split("+")[0] != "sqlite":
        return None
    head, _, name = (parsed.database or "").rpartition("/")
    if (m := _SIDECAR.search(name)) is None:
        return None
    return (f"{field}={shown(url)!r} names SQLite's own {m.group(1)} file of "
            f"the database {name[:m.start()]!r}, which SQLite writes and deletes with that "
            "database's transactions, not a database: name a database file, e.g. "
            f"{parsed.drivername}:///{head}/team-a.db")


def resolve_storage(url: str, rules: tuple[StorageRule, ...], namespace: str) -> str:
    """The storage URL the operator opens for a CR of ``namespace`` that asks for ``url``.

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
        if (target := rule.resolve(parsed, url, namespace)) is not None:
            return target
    for rule in rules:  # why not: said from the URL's text and the entry alone
        owner = rule.claimed(parsed)
        if owner is None:
            continue
        if owner == namespace and (why := rule.unusable_in(namespace)) is not None:
            raise StorageRefused(f"spec.tuning.storage={shown(url)!r}: {why}")
        if owner != namespace and rule.resolve(parsed, url, owner) is not None:
            raise StorageRefused(
                f"spec.tuning.storage={shown(url)!r} is another namespace's storage under "
                f"the allow-list entry {shown_entry(rule.entry)!r}: an entry with {NAMESPACE} "
                "allows each namespace its own storage only; in namespace "
                f"{namespace} it allows {shown_entry(rule.applied(namespace))!r}")
    raise StorageRefused(
        f"spec.tuning.storage={shown(url)!r} is not on the operator's storage allow-list "
        f"for namespace {namespace} ({allowed_in(rules, namespace)}): use an allowed "
        "storage, or ask the cluster admin to add it to SLOPILOT_ALLOWED_STORAGE")


def allowed_in(rules: tuple[StorageRule, ...], namespace: str) -> str:
    """The allow-list as it applies to a CR of ``namespace``, for a message."""
    return ", ".join(shown_entry(r.applied(namespace)) for r in rules) or "empty"


def shared_with_namespaces(rules: tuple[StorageRule, ...]) -> list[str]:
    """A warning for each entry that gives every namespace what a ``{namespace}`` entry
    of the list keeps for one: ``*``, or a directory entry of the same directory. Legal
    (a cluster of one team), but it undoes the placeholder."""
    own = [r for r in rules if r.per_namespace]
    if not own:
        return []
    directories = {r.shape.url.database.rpartition("/")[0] for r in own
                   if r.shape is not None and r.shape.url.database
                   and NAMESPACE not in r.shape.url.database.rpartition("/")[0]}
    out = []
    for rule in rules:
        shared = rule.shape is None or (
            not rule.per_namespace and rule.shape.files is not None
            and rule.shape.files[1:] == ("", "") and rule.shape.files[0] in directories)
        if shared:
            out.append(f"SLOPILOT_ALLOWED_STORAGE: {shown_entry(rule.entry)!r} allows every "
                       "namespace the storages its {namespace} entries keep for one "
                       f"({', '.join(shown_entry(r.entry) for r in own)}): a tenant may name "
                       "another namespace's; drop it where the cluster is shared")
    return out
