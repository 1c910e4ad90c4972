"""The listening socket of ``slopilot serve`` and ``slopilot meter``, bound before
uvicorn starts, and the error that names the flag to change when it cannot be.

uvicorn's own bind logged "[Errno 98] address already in use" among its INFO lines and
exited 3, naming no flag (the meter's); an unknown ``--host`` was blamed on the port.
"""

from __future__ import annotations

import errno
import socket

_HOST_ERRNOS = frozenset({errno.EADDRNOTAVAIL})
"""Errors of the address itself: no interface of this machine has it."""


class ListenError(OSError):
    """``host:port`` cannot be listened on; the message names the flag to change: the
    host's for a name that does not resolve or an address this machine does not have,
    the port's for one taken or kept for privileged processes."""

    def __init__(self, port_flag: str, host: str, port: int, exc: OSError,
                 host_flag: str = "--host") -> None:
        why = exc.strerror or str(exc)
        where = f"cannot listen on {host}:{port}: {why}"
        if isinstance(exc, socket.gaierror) or exc.errno in _HOST_ERRNOS:
            self.flag = host_flag
            message = (f"{host_flag} {host}: {where}; give an address of this machine, "
                       "e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")
        elif exc.errno == errno.EACCES:
            self.flag = port_flag
            message = (f"{port_flag} {port}: {where}; ports below 1024 need privileges: "
                       "pick one above 1023 (0 picks a free one)")
        else:
            self.flag = port_flag
            message = (f"{port_flag} {port}: {where}; stop what holds it or pick another "
                       "port (0 picks a free one)")
        super().__init__(exc.errno, message)

    def __str__(self) -> str:
        return str(self.strerror)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (0 picks a free port); OSError as
    the socket layer raises it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_listen(host: str, port: int, port_flag: str = "--port",
                host_flag: str = "--host") -> socket.socket:
    """``bind_socket``, its failure a ``ListenError`` naming ``host_flag`` or
    ``port_flag``."""
    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise ListenError(port_flag, host, port, exc, host_flag) from exc
