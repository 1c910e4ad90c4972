"""A SQLite file is opened as study storage only when it holds a study database, or
nothing yet.

Optuna makes its tables in whatever database a URL names: given another application's
SQLite file (``tune --storage sqlite:///app.db``), it added its 12 tables and
``alembic_version`` to the user's database, then failed on the user's own ``trials``
table with a traceback. The file is read here first, read-only, and refused unless it is
empty or has Optuna's own tables.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from slopilot.tuner.study.storage_url import parse_storage_url

OPTUNA_TABLES = ("studies", "version_info")
"""Tables every Optuna RDB storage has; ``version_info`` is Optuna's alone (a table named
``studies`` or ``trials`` may well be another application's)."""
_READ_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"


def foreign_sqlite(url: str) -> str | None:
    """Why ``url``'s SQLite file must not be opened as study storage (it holds other
    tables, or is not SQLite), naming the file and the fix; None when it may be (not a
    SQLite URL, a file not there yet or empty, a study database, or one that cannot be
    read here, which opening it will report)."""
    parsed = parse_storage_url(url)
    if parsed is None or parsed.drivername.split("+")[0] != "sqlite":
        return None
    name = parsed.database
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    path = Path(name)
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = sorted(row[0] for row in db.execute(_READ_TABLES))
        finally:
            db.close()
    except sqlite3.OperationalError:
        return None  # locked, or not readable by this user: the open says why
    except sqlite3.DatabaseError as exc:  # "file is not a database"
        return (f"{path} is not a SQLite database ({exc}); name a new file (it is "
                "created) or a study database that slopilot made")
    except OSError:
        return None
    if not tables or all(t in tables for t in OPTUNA_TABLES):
        return None
    shown = ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")
    return (f"{path} is not a study database: it holds {len(tables)} tables of its own "
            f"({shown}), not Optuna's ({', '.join(OPTUNA_TABLES)}), and opening it would "
            "add Optuna's tables to it; name a new file (it is created) or a study "
            "database that slopilot made")
