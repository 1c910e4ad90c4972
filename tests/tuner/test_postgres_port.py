"""The study-storage tests' PostgreSQL binds the port it was given, whoever else starts.

Each pytest worker starts one; its port was found free and let go before ``pg_ctl``
started the server, and a server another worker started meanwhile could take it. The
test takes the port in that gap on purpose, as that server would have.
"""

from __future__ import annotations

import socket

import psycopg

from tests.support.ports import take_port
from tests.support.postgres import serve, server_tools


def test_postgres_starts_on_its_port_though_another_server_wants_it() -> None:
    bin_dir, prefix = server_tools()
    intruders: list[socket.socket] = []

    def take(port: int) -> None:
        if (sock := take_port(port)) is not None:
            intruders.append(sock)

    try:
        with serve(bin_dir, prefix, before_start=take) as server, psycopg.connect(
                server.url("postgres")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for sock in intruders:
            sock.close()
    assert intruders == []
