"""A loopback port kept for a child server from before it starts until it is done with it.

A port found free and let go (bind to 0, then close) is anyone's until the child binds
it, and a child takes seconds to get there: a replica's Python start, a Prometheus
brought back after ``stop()``. Another process's bind to port 0 (a test server on
another pytest worker) can get it meanwhile, and the child then exits "address already
in use". Held here, bound with ``SO_REUSEADDR`` and never listened on, Linux hands the
port to no bind to port 0, no outgoing connection and no bind without that option, while
a server that binds it with ``SO_REUSEADDR`` (``listen_socket.bind_socket``: serve's and
the meter's; Go's listeners: Prometheus) listens there as if it were free.
"""

from __future__ import annotations

import socket


class HeldPort:
    """A TCP port on ``host`` that no other socket takes until ``release()``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, 0))
        except OSError:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    @property
    def held(self) -> bool:
        return self._sock is not None

    def release(self) -> None:
        """Let the port go (idempotent): once its server is gone for good."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
