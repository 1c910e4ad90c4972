"""Which flag a failed bind names: the host's for the address, the port's for the port."""

from __future__ import annotations

import errno
import socket

import pytest

from slopilot.engine.listen_socket import ListenError, bind_listen


@pytest.mark.parametrize(("exc", "flag", "fix"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "--host nowhere",
     "give an address of this machine"),
    (OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"), "--host nowhere",
     "give an address of this machine"),
    (OSError(errno.EADDRINUSE, "Address already in use"), "--admin-port 81",
     "stop what holds it or pick another port"),
    (OSError(errno.EACCES, "Permission denied"), "--admin-port 81",
     "ports below 1024 need privileges"),
])
def test_the_error_names_the_flag_that_fixes_it(exc: OSError, flag: str, fix: str) -> None:
    err = ListenError("--admin-port", "nowhere", 81, exc)
    assert str(err).startswith(f"{flag}: cannot listen on nowhere:81: {exc.strerror}; ")
    assert fix in str(err)
    assert err.flag == flag.split()[0] and err.errno == exc.errno


def test_a_port_held_by_a_listener_is_refused_and_a_free_one_bound() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as caught:
            bind_listen("127.0.0.1", port, "--port")
    assert caught.value.flag == "--port"
    assert caught.value.errno == errno.EADDRINUSE
    with bind_listen("127.0.0.1", 0) as sock:
        assert sock.getsockname()[1] != 0
