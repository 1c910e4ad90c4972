"""A throwaway PostgreSQL server for tests: initdb in a temp dir, a Unix socket only.

Skips (returns None from ``find_postgres``) when the server binaries are absent. As root
(where initdb refuses to run) the server runs as the ``postgres`` user via runuser.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.local_server import free_port


def find_postgres() -> Path | None:
    """The directory holding initdb and pg_ctl, or None."""
    for candidate in [shutil.which("initdb"), *sorted(
            str(p) for p in Path("/usr/lib/postgresql").glob("*/bin/initdb"))]:
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve().parent
    return None


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("running as root and no 'postgres' user to run the server as") \
            from None
    return ["runuser", "-u", "postgres", "--"]


@contextmanager
def postgres_server(bindir: Path) -> Iterator[str]:
    """Yield a SQLAlchemy URL to a fresh database; the server stops and its files go on exit.

    The data lives in its own temp dir (not pytest's, which the server user may not read).
    """
    prefix = _as_server_user()
    workdir = Path(tempfile.mkdtemp(prefix="slopilot-pg-"))
    data, sock = workdir / "data", workdir / "sock"
    sock.mkdir()
    if prefix:
        for path in (workdir, sock):
            shutil.chown(path, "postgres")
    user = "postgres" if prefix else pwd.getpwuid(os.geteuid()).pw_name
    try:
        subprocess.run([*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", user], check=True, capture_output=True, timeout=120)
        port = free_port()
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l",
                        str(workdir / "pg.log"), "-o",
                        f"-p {port} -k {sock} -c listen_addresses=''", "start"],
                       check=True, capture_output=True, timeout=120)
        try:
            yield f"postgresql+psycopg2://{user}@/postgres?host={sock}&port={port}"
        finally:
            subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast",
                            "-w", "stop"], capture_output=True, timeout=120, check=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
