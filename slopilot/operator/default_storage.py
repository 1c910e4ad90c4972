"""The study storage of a CR that names none: the administrator's, per namespace.

The CRD used to write ``sqlite:////var/lib/slopilot/study.db`` into every CR that left
``spec.tuning.storage`` out, so on a shared cluster every such tenant wrote into one
SQLite file (one writer at a time), and under an allow-list that gives each namespace
its own storage every such CR was refused until its tenant wrote its namespace's URL by
hand. Now the CRD writes nothing, and the administrator names once what a CR without the
field gets: ``$SLOPILOT_DEFAULT_STORAGE`` (default: ``knobs.DEFAULT_STUDY_STORAGE``, the
operator's own file, as before). It may hold ``{namespace}`` where an allow-list entry
may (storage_entry.py), so that each namespace gets its own
(``sqlite:////var/lib/slopilot/teams/{namespace}.db``,
``postgresql://optuna@db/studies_{namespace}``).

It stands for what the CR would have written (``named``): one database, without a
password (a CR's storage goes into its status and the operator's record, which are not
secret; the allow-list entry that allows it brings the credentials), resolved through
the allow-list like any written URL. Read at the start (``DefaultStorage``), and checked
against the allow-list there when the administrator sets it (``refusal``): a default the
list refuses would refuse every CR that names no storage, long after the start. Left
unset under a list that refuses the shipped file (an install set up before this
setting), the operator starts with a warning, and such a CR is refused naming both fixes
(``resolve_unwritten``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slopilot.operator.knobs import MAX_STORAGE_URL
from slopilot.operator.storage_entry import (
    NAMESPACE,
    EntryError,
    entry_without_password,
    read_entry,
    shown_entry,
)
from slopilot.operator.study_storage import (
    StorageRefused,
    StorageRule,
    allowed_in,
    resolve_storage,
    sqlite_sidecar_problem,
)
from slopilot.operator.validation import MAX_LABEL
from slopilot.tuner.study.storage_url import parse_storage_url, shown

DEFAULT_STORAGE_ENV = "SLOPILOT_DEFAULT_STORAGE"
CHECKED_NAMESPACES = ("default", "team-a")
"""The namespaces the start resolves the default for: two, so that a default naming one
namespace's storage under a ``{namespace}`` entry is refused for the other."""
_EXAMPLE = (f"e.g. sqlite:////var/lib/slopilot/teams/{NAMESPACE}.db or "
            f"postgresql://optuna@db/studies_{NAMESPACE}")


@dataclass(frozen=True)
class DefaultStorage:
    """``$SLOPILOT_DEFAULT_STORAGE`` as read; StorageRefused, naming the variable, the
    value and the fix, where it names no one database a CR could have written."""

    value: str
    rule: StorageRule = field(init=False, repr=False, compare=False)
    """The value read as an allow-list entry: the same ``{namespace}`` rules, and its
    ``applied`` is the URL for a namespace."""

    def __post_init__(self) -> None:
        label = f"{DEFAULT_STORAGE_ENV}={shown_entry(self.value)!r}"
        parsed = parse_storage_url(self.value)
        if NAMESPACE not in self.value and (
                parsed is None or parsed.drivername.split("+")[0] not in ("sqlite",
                                                                         "postgresql")):
            raise StorageRefused(f"{label} is not a database URL: write the one database a "
                                 f"CR that names no spec.tuning.storage gets, with "
                                 f"{NAMESPACE} for one per namespace, {_EXAMPLE}")
        try:
            shape = read_entry(self.value, label=label)
        except EntryError as exc:
            raise StorageRefused(str(exc)) from None
        if self.value == "*" or shape.files is not None:
            raise StorageRefused(f"{label} names no one database but any file of a "
                                 "directory: write the one database a CR that names no "
                                 f"spec.tuning.storage gets, {_EXAMPLE}")
        if shape.url.password:
            raise StorageRefused(
                f"{label} holds a password, which each CR's status and the operator's "
                "record of study storages would show: write "
                f"{entry_without_password(self.value)!r} and put the credentials in the "
                "SLOPILOT_ALLOWED_STORAGE entry that allows it (the operator opens it with "
                "them)")
        if (problem := sqlite_sidecar_problem(self.value, DEFAULT_STORAGE_ENV)) is not None:
            raise StorageRefused(problem)
        object.__setattr__(self, "rule", StorageRule(self.value))
        longest = len(self.named("n" * MAX_LABEL))
        if longest > MAX_STORAGE_URL:
            # The record of study storages keeps none longer (study_ledger.py): a
            # namespace's studies under it would never be reclaimed.
            raise StorageRefused(f"{label} is {longest} characters for a namespace of "
                                 f"{MAX_LABEL}, past the {MAX_STORAGE_URL} of a storage URL: "
                                 f"write a shorter one, {_EXAMPLE}")

    def named(self, namespace: str) -> str:
        """The storage URL a CR of ``namespace`` names by leaving the field out, as if
        written there (no password)."""
        return self.rule.applied(namespace)

    def refusal(self, rules: tuple[StorageRule, ...]) -> str | None:
        """Why the allow-list ``rules`` would refuse a CR that names no storage, or None
        (checked for ``CHECKED_NAMESPACES``)."""
        for namespace in CHECKED_NAMESPACES:
            named = self.named(namespace)
            try:
                resolve_storage(named, rules, namespace)
            except StorageRefused:
                return (f"in namespace {namespace} it names {shown(named)!r}, which the "
                        f"storage allow-list refuses there (it allows "
                        f"{allowed_in(rules, namespace)})")
        return None

    def start_problem(self, rules: tuple[StorageRule, ...]) -> str | None:
        """What stops the start where the administrator set this default and ``rules``
        refuse it; None where they allow it."""
        if (why := self.refusal(rules)) is None:
            return None
        return (f"{DEFAULT_STORAGE_ENV}={shown_entry(self.value)!r}: {why}, so every CR "
                "there that names no spec.tuning.storage would be refused: list it in "
                f"SLOPILOT_ALLOWED_STORAGE, or set {DEFAULT_STORAGE_ENV} to a storage that "
                "list allows for every namespace")

    def unset_warning(self, rules: tuple[StorageRule, ...]) -> str | None:
        """The warning at a start where the default is left unset and ``rules`` refuse
        it (an install whose list predates the setting: it keeps starting)."""
        if (why := self.refusal(rules)) is None:
            return None
        return (f"{DEFAULT_STORAGE_ENV} is unset: a CR that names no spec.tuning.storage "
                f"gets {shown_entry(self.value)!r}: {why}, so every such CR is refused "
                f"there: set {DEFAULT_STORAGE_ENV} to a storage SLOPILOT_ALLOWED_STORAGE "
                f"allows for every namespace (with {NAMESPACE} for each its own; without "
                "a password)")


def resolve_unwritten(default: DefaultStorage, rules: tuple[StorageRule, ...],
                      namespace: str) -> str:
    """The storage URL to open for a CR of ``namespace`` that names none (the admin's,
    with credentials); StorageRefused naming both fixes where the list refuses it."""
    named = default.named(namespace)
    try:
        return resolve_storage(named, rules, namespace)
    except StorageRefused:
        # An entry with no extension names, for a namespace ending in -journal (-wal, ...),
        # the side file of another namespace's database: saying the list refuses it, then
        # printing the list's entry, the same URL, would leave the reader nothing to fix.
        if (side := sqlite_sidecar_problem(named, DEFAULT_STORAGE_ENV)) is not None:
            raise StorageRefused(
                f"spec.tuning.storage is not written, and for namespace {namespace} {side} "
                "(an entry ending in {namespace}, with no extension, does so for every "
                "namespace ending in -journal, -wal, -shm or -mj...): name an allowed "
                "storage in spec.tuning.storage, or ask the cluster admin for a default "
                "with an extension, e.g. .../{namespace}.db") from None
        raise StorageRefused(
            f"spec.tuning.storage is not written, and this namespace's default storage, "
            f"{shown(named)!r} (the operator's {DEFAULT_STORAGE_ENV}), is not one its "
            f"storage allow-list allows for namespace {namespace} "
            f"({allowed_in(rules, namespace)}): name an allowed storage in "
            f"spec.tuning.storage, or ask the cluster admin to set {DEFAULT_STORAGE_ENV} "
            "to one SLOPILOT_ALLOWED_STORAGE allows") from None


def instead(default: DefaultStorage, rules: tuple[StorageRule, ...], namespace: str,
            written: str) -> str:
    """For the refusal of ``written``: the namespace's default, which removing the field
    gives, where the list allows it and it is another storage; else nothing."""
    named = default.named(namespace)
    if named == written:
        return ""
    try:
        resolve_storage(named, rules, namespace)
    except StorageRefused:
        return ""
    return (f"; or remove spec.tuning.storage for this namespace's default storage, "
            f"{shown(named)}")
