"""A port that refuses every connection, for the tests of a server that is down."""

from __future__ import annotations

import errno
import socket
import threading

_lock = threading.Lock()
_held: socket.socket | None = None


def refused_port() -> int:
    """A port on 127.0.0.1 that refuses every connection for as long as this process
    lives: bound and never listened on. A port found free and let go (``free_port``) can
    be taken meanwhile by a server another xdist worker starts, and the test that meant
    "nothing listens there" then reaches it; this one no other socket can bind."""
    global _held
    with _lock:
        if _held is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            _held = sock
        port: int = _held.getsockname()[1]
        return port


def take_port(port: int) -> socket.socket | None:
    """A socket listening on ``port``, as another process's server would be there, or
    None where Linux refuses the port (``HeldPort``). Bound as a bind to port 0 binds (no
    ``SO_REUSEADDR``): that is how another process gets a port it did not ask for by
    number, which its ``free_port`` helper then hands on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        return None
    return sock
