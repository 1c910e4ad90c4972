"""How long ago a TCP connection's newest bytes reached the kernel (Linux's ``TCP_INFO``).

A request's bytes can wait in the kernel before the server's event loop reads them: in
the socket's receive queue while the loop is busy (other streams, a GC pause, a process
stopped or throttled), or with their whole connection in the listen socket's accept
queue. The client's TTFT counts that wait; a stamp taken at the read does not. The kernel
keeps, for each connection, when its last data segment came in (``lrcvtime``, the time
``tcpi_last_data_recv`` counts from): read at the read, it backdates the stamp to when
the newest of the bytes being read arrived (the earlier ones in the same read are not
told apart; they came in at most that much earlier).

Its unit is the kernel's tick (jiffies, 1-10 ms: 4 ms at ``CONFIG_HZ=250``), reported in
ms, so a reading is within one tick of the truth either way (rarely more on a virtual
machine whose ticks come late: one in 300 read 13 ms over on a loaded 2-vCPU VM); below a
tick it reads 0 or one tick, which averages out to the truth. One ``getsockopt`` a read:
4 us on asyncio's socket, 10 us on uvloop's, measured at a load of 22 on 2 CPUs.

What it cannot see: a connection whose handshake the kernel has not completed (a SYN
dropped or held because the accept queue overflowed waits for the client's retransmit,
and its data with it), and anything outside the server's host. Elsewhere than Linux, or
on a socket not TCP's, there is nothing to read: the stamp stays the read's.

``sock.getsockopt`` over ``socket.socket`` and uvloop's stand-in alike: asyncio's and
uvloop's transports give the connection's socket as ``get_extra_info("socket")``, and
neither passes a read's ancillary data (``SO_TIMESTAMPNS``) up to the protocol.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import Protocol

_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
# struct tcp_info (linux/tcp.h): 8 one-byte fields, then __u32s; tcpi_last_data_recv is
# the 12th (rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets,
# last_data_sent, last_ack_sent, last_data_recv), ms since the last data segment came in.
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_OFFSET = 52
_LENGTH = _LAST_DATA_RECV_OFFSET + _LAST_DATA_RECV.size

# Clocks that count real seconds, as the kernel's jiffies do: a lag read from the kernel
# can be taken off their readings, and off no test's made-up time.
REAL_TIME_CLOCKS: tuple[Callable[[], float], ...] = (time.monotonic, time.perf_counter,
                                                     time.time)


def counts_real_time(clock: Callable[[], float]) -> bool:
    """Whether ``clock`` is one of ``REAL_TIME_CLOCKS``, whose readings a kernel's lag
    can be taken off."""
    return clock in REAL_TIME_CLOCKS


Lag = Callable[[], float]
"""Seconds since the connection's newest bytes reached the kernel (0.0 when unknown)."""


class _Socket(Protocol):
    @property
    def family(self) -> int: ...
    @property
    def type(self) -> int: ...
    def getsockopt(self, level: int, option: int, buflen: int) -> bytes: ...


def since_last_data(sock: _Socket) -> float | None:
    """Seconds since ``sock``'s last data segment reached the kernel, to the kernel's
    tick; None where the kernel does not tell (not Linux, not TCP, closed)."""
    read = _reader(sock)
    return None if read is None else read()


def _reader(sock: _Socket) -> Callable[[], float | None] | None:
    # Checked once a connection: a read pays one getsockopt and an unpack.
    if (_TCP_INFO is None or sock.family not in (socket.AF_INET, socket.AF_INET6)
            or sock.type != socket.SOCK_STREAM):
        return None
    getsockopt, option, unpack = sock.getsockopt, _TCP_INFO, _LAST_DATA_RECV.unpack_from

    def read() -> float | None:
        try:
            info = getsockopt(socket.IPPROTO_TCP, option, _LENGTH)
        except OSError:  # the connection went away under the read
            return None
        if len(info) < _LENGTH:  # a kernel older than the field (before 2.6)
            return None
        ms: int = unpack(info, _LAST_DATA_RECV_OFFSET)[0]
        return ms / 1000

    return read


def connection_lag(transport: asyncio.BaseTransport) -> Lag | None:
    """A reader of ``since_last_data`` for the transport's connection, or None where
    there is none to read (a test's transport, a Unix socket, not Linux)."""
    sock = transport.get_extra_info("socket")
    read = None if sock is None else _reader(sock)
    if read is None or read() is None:
        return None

    def lag() -> float:
        return read() or 0.0

    return lag
