"""``bound_send_ahead`` on a real connection: the kernel's unsent bound and the
transport's own, and the one log line where the platform has no ``TCP_NOTSENT_LOWAT``;
``unacked_bytes``, and its one log line where the platform cannot say."""

from __future__ import annotations

import asyncio
import logging
import socket
import termios
from collections.abc import Callable
from typing import Any

import pytest

from slopilot.engine import send_ahead
from slopilot.engine.send_ahead import SEND_AHEAD_BYTES, bound_send_ahead, unacked_bytes


async def _accepted(check: Callable[[Any], None]) -> None:
    """Run ``check(transport)`` on the server side of a loopback connection."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            try:
                check(transport)
                done.set_result(None)
            except BaseException as exc:  # handed to the test
                done.set_exception(exc)

    srv = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await done
        writer.close()
    finally:
        srv.close()
        await srv.wait_closed()


@pytest.mark.skipif(not hasattr(socket, "TCP_NOTSENT_LOWAT"), reason="Linux's option")
def test_the_kernel_holds_16_kib_unsent_and_the_transport_none() -> None:
    def check(transport: asyncio.WriteTransport) -> None:
        bound_send_ahead(transport)
        sock = transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT) == SEND_AHEAD_BYTES
        assert transport.get_write_buffer_limits() == (0, 0)

    asyncio.run(_accepted(check))


def test_a_platform_without_the_option_is_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(socket, "TCP_NOTSENT_LOWAT", raising=False)
    monkeypatch.setattr(send_ahead, "_fallback_said", False)
    caplog.set_level(logging.WARNING, logger=send_ahead.__name__)

    def check(transport: asyncio.WriteTransport) -> None:
        bound_send_ahead(transport)
        bound_send_ahead(transport)
        assert transport.get_write_buffer_limits() == (0, 0)  # the transport's still holds

    asyncio.run(_accepted(check))
    said = [r.getMessage() for r in caplog.records if "TCP_NOTSENT_LOWAT" in r.getMessage()]
    assert len(said) == 1 and "send deadline" in said[0], said


@pytest.mark.skipif(not hasattr(termios, "TIOCOUTQ"), reason="Linux's ioctl")
def test_unacked_bytes_is_what_the_client_has_not_acknowledged() -> None:
    def check(transport: asyncio.WriteTransport) -> None:
        assert unacked_bytes(transport) == 0  # nothing written yet
        # Not on a wire: a transport with no socket cannot say (the tests' own).
        assert unacked_bytes(asyncio.Transport()) is None

    asyncio.run(_accepted(check))


def test_a_platform_without_tiocoutq_is_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delattr(termios, "TIOCOUTQ", raising=False)
    monkeypatch.setattr(send_ahead, "_unacked_said", False)
    caplog.set_level(logging.WARNING, logger=send_ahead.__name__)

    def check(transport: asyncio.WriteTransport) -> None:
        assert unacked_bytes(transport) is None
        assert unacked_bytes(transport) is None

    asyncio.run(_accepted(check))
    said = [r.getMessage() for r in caplog.records if "acknowledged" in r.getMessage()]
    assert len(said) == 1 and "send deadline" in said[0], said


def test_a_closed_socket_says_nothing_is_left_and_spends_no_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A transport whose socket is closed (fileno -1): the ioctl raised ValueError, which
    nothing caught; and a closed socket is no platform that cannot say."""
    monkeypatch.setattr(send_ahead, "_unacked_said", False)
    caplog.set_level(logging.WARNING, logger=send_ahead.__name__)
    closed = socket.socket()
    closed.close()

    class Closed(asyncio.Transport):
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return closed if name == "socket" else default

    assert unacked_bytes(Closed()) is None
    assert not send_ahead._unacked_said and not caplog.records
