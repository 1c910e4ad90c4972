"""A throwaway PostgreSQL server for the study-storage tests: Debian's server binaries
(``initdb``, ``pg_ctl``; ``make test`` installs the ``postgresql`` package), one data
directory per session, a port of its own, no password (trust on 127.0.0.1 only).

PostgreSQL refuses to run as root: as root it runs as the ``postgres`` user the package
creates, in a directory that user owns (pytest's own temporary directory is root's alone).
Where the binaries are missing the tests skip, unless ``SLOPILOT_REQUIRE_POSTGRES`` is set.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from slopilot.tuner.local.held_port import HeldPort
from tests.support.fixtures import missing

REQUIRE_ENV = "SLOPILOT_REQUIRE_POSTGRES"
USER = "optuna"


@dataclass(frozen=True)
class PostgresServer:
    port: int

    def url(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{USER}@127.0.0.1:{self.port}/{database}"


def _bin_dir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                      key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _as_server_user() -> list[str]:
    """The command prefix that runs the server's tools as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    pwd.getpwnam("postgres")  # KeyError: no such user, no way to run it as root
    return ["runuser", "-u", "postgres", "--"]


def server_tools() -> tuple[Path, list[str]]:
    """The server's tools and the prefix that runs them; skipped (failed where
    ``REQUIRE_ENV`` says they must be) where there are none, or no user to run them."""
    bin_dir = _bin_dir()
    try:
        prefix = _as_server_user() if bin_dir else []
    except KeyError:
        bin_dir = None
    if bin_dir is None:
        missing("no PostgreSQL server binaries (pg_ctl, initdb) and a user to run them "
                "(install them: apt-get install -y postgresql)", REQUIRE_ENV)
    return bin_dir, prefix


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with serve(*server_tools()) as server:
        yield server


@contextmanager
def serve(bin_dir: Path, prefix: list[str], *,
          before_start: Callable[[int], object] = lambda port: None
          ) -> Iterator[PostgresServer]:
    """A server from ``bin_dir``'s tools run under ``prefix``, stopped at the end;
    ``before_start(port)`` is called just before the server is told to bind ``port``."""
    home = Path(tempfile.mkdtemp(prefix="slopilot-pg-"))
    if prefix:
        shutil.chown(home, "postgres")
    # Held until it is stopped, not found free and let go: PostgreSQL binds it with
    # SO_REUSEADDR as a held port allows; another worker's server cannot take it first.
    held = HeldPort()
    data, port = home / "data", held.port

    def run(*cmd: str) -> None:
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, timeout=120)

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER,
            "--no-sync")
        before_start(port)
        # -w: pg_ctl returns once the server accepts connections (a condition, not a wait).
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l", str(home / "log"), "-o",
            f"-p {port} -h 127.0.0.1 -k {home} -c fsync=off", "start")
        try:
            yield PostgresServer(port)
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
    finally:
        held.release()
        shutil.rmtree(home, ignore_errors=True)


def create_database(server: PostgresServer, name: str) -> None:
    """A database of ``name`` on ``server`` (the storages' own: one per test)."""
    import psycopg

    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
