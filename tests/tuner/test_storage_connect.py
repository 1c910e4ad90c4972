"""A study storage whose database does not answer is an error, not a thread held.

The operator opens a CR's study on its tuning daemon's thread and deletes it, with
tuning off, on one of kopf's handler threads, which every tenant's handlers share. libpq
waits for a server that accepts the connection and says nothing (a database hung, a
proxy in front of one down) for as long as it stays so, and for an unreachable one the
kernel's SYN retries, about two minutes: each such call held its thread that long, and
a tenant deleting many CRs then held many.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from slopilot.tuner.study.heartbeat import rdb_storage
from tests.support.waits import HANG_GUARD_S


@contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers them."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


def test_a_postgres_that_never_answers_is_an_error_within_the_connect_timeout() -> None:
    outcome: list[BaseException | None] = []

    def open_storage(port: int) -> None:
        try:
            rdb_storage(f"postgresql://slopilot@127.0.0.1:{port}/studies", 30, 300,
                        connect_timeout_s=2)
            outcome.append(None)
        except Exception as exc:  # what the caller gets: an error it can report
            outcome.append(exc)

    with silent_server() as port:
        thread = threading.Thread(target=open_storage, args=(port,), daemon=True)
        thread.start()
        thread.join(HANG_GUARD_S)
        assert not thread.is_alive(), "the storage waited on a silent database"
    [error] = outcome
    assert type(error).__name__ == "OperationalError", error  # SQLAlchemy's, from libpq
    assert "timeout expired" in str(error), error


@pytest.mark.parametrize("bad", [0, -1, 1, 1.5, True])
def test_a_connect_timeout_libpq_cannot_take_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="connect_timeout_s"):
        rdb_storage("sqlite://", 30, 300, connect_timeout_s=bad)  # type: ignore[arg-type]
