from __future__ import annotations

import socket

import pytest

from tests.support.ports import refused_port


def test_the_refused_port_refuses_and_no_server_can_take_it() -> None:
    port = refused_port()
    assert refused_port() == port  # one for the process
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port)).close()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        with pytest.raises(OSError, match="in use"):
            server.bind(("127.0.0.1", port))
