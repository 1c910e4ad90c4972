"""A request's arrival is the time of the read that brought its last byte (the end of its
head and whole body: when the server could start on it), in both HTTP protocols the
servers run (h11: ``slopilot serve``; httptools: the meter).

The protocol is driven as asyncio drives it, read by read, on a clock the test sets: a
pipelined request's app is called only once the request before it is answered, and its
stamp must still be the time its bytes came in, not that later moment. The app reads the
stamp once it has read the body, as the server's and the meter's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from slopilot.engine.http_arrival import SCOPE_KEY, h11_protocol, httptools_protocol

Clock = Callable[[], float]
PROTOCOLS = [pytest.param(h11_protocol, id="h11"),
             pytest.param(httptools_protocol, id="httptools")]


def _request(path: str, body: bytes = b'{"prompt": "hi"}') -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (path.encode(), len(body)) + body)


def _chunked_head(path: str) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % path.encode())


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000),
                "sockname": ("127.0.0.1", 8000)}.get(name, default)


class _App:
    """Records each request's stamp as the app sees it; answers a path when told to."""

    def __init__(self) -> None:
        self.stamps: dict[str, float | None] = {}
        self.answer: dict[str, asyncio.Event] = {}

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        while (await receive()).get("more_body"):
            pass
        # Read once the body is whole, as the server's routes and the meter read it.
        self.stamps[path] = scope.get(SCOPE_KEY)
        await self.answer.setdefault(path, asyncio.Event()).wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def called(self, path: str) -> None:
        """Returns once the app has read ``path``'s body (within a bounded number of
        turns of the loop: nothing here waits on time)."""
        for _ in range(1000):
            if path in self.stamps:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"the app never read {path}'s body")


class _Connection:
    """One client connection into a stamping protocol, on a clock the test sets."""

    def __init__(self, factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
        self.now = 0.0
        self.app = _App()
        config = uvicorn.Config(self.app, lifespan="off", log_config=None,
                                proxy_headers=False)
        config.load()
        cls: Any = factory(lambda: self.now)
        self.protocol = cls(config, ServerState(), {}, _loop=asyncio.get_running_loop())
        self.protocol.connection_made(_Transport())

    def read(self, at: float, data: bytes) -> None:
        """The socket read ``data`` at ``at``."""
        self.now = at
        self.protocol.data_received(data)

    async def answer(self, path: str, at: float) -> None:
        await self.app.called(path)
        self.now = at
        self.app.answer.setdefault(path, asyncio.Event()).set()
        for _ in range(10):  # the app's task writes its answer in a turn or two
            await asyncio.sleep(0)

    def close(self) -> None:
        self.protocol.connection_lost(None)


def _run(factory: Callable[[Clock], type[asyncio.Protocol]],
         script: Callable[[_Connection], Any]) -> dict[str, float | None]:
    async def main() -> dict[str, float | None]:
        conn = _Connection(factory)
        try:
            await script(conn)
        finally:
            conn.close()
        return conn.app.stamps

    return asyncio.run(main())


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_one_read_with_a_requests_tail_and_the_next_ones_head_stamps_the_next_then(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    one, two = _request("/one"), _request("/two")

    async def script(conn: _Connection) -> None:
        conn.read(1.0, one[:30])
        conn.read(2.0, one[30:] + two)
        # /two's app runs only now, once /one is answered: its stamp is still 2.
        await conn.answer("/one", at=5.0)
        await conn.answer("/two", at=6.0)

    # /one's last byte came at 2, with the whole of /two.
    assert _run(factory, script) == {"/one": 2.0, "/two": 2.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_request_read_while_the_one_before_is_answered_is_stamped_when_read(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    async def script(conn: _Connection) -> None:
        conn.read(1.0, _request("/one"))
        await conn.app.called("/one")
        conn.read(3.0, _request("/two"))
        await conn.answer("/one", at=5.0)
        await conn.answer("/two", at=6.0)

    assert _run(factory, script) == {"/one": 1.0, "/two": 3.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_requests_buffered_behind_another_keep_the_time_their_last_bytes_came(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    three = _request("/three")

    async def script(conn: _Connection) -> None:
        # /three's head begins in the first read and ends in the second: its last byte
        # came at 2, however late its turn came.
        conn.read(1.0, _request("/one") + _request("/two") + three[:10])
        conn.read(2.0, three[10:])
        await conn.answer("/one", at=5.0)
        await conn.answer("/two", at=6.0)
        await conn.answer("/three", at=7.0)

    assert _run(factory, script) == {"/one": 1.0, "/two": 1.0, "/three": 2.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_head_split_over_two_reads_is_stamped_by_the_second(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    one = _request("/one")

    async def script(conn: _Connection) -> None:
        conn.read(1.0, one[:12])
        conn.read(2.0, one[12:])
        await conn.answer("/one", at=5.0)
        conn.read(8.0, _request("/two"))  # a new request on the kept-alive connection
        await conn.answer("/two", at=9.0)

    assert _run(factory, script) == {"/one": 2.0, "/two": 8.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_body_trickled_over_reads_is_stamped_by_the_read_of_its_last_byte(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    """The client's upload is its link's time, not the server's: the head and 10 bytes
    of the body at 1, the rest 3 s later; the server could start only at 4."""
    one = _request("/one", body=b'{"prompt": "' + b"x" * 40 + b'"}')
    head = one.index(b"\r\n\r\n") + 4

    async def script(conn: _Connection) -> None:
        conn.read(1.0, one[:head + 10])
        conn.read(2.0, one[head + 10:head + 20])
        conn.read(4.0, one[head + 20:])
        await conn.answer("/one", at=5.0)
        conn.read(8.0, _request("/two"))
        await conn.answer("/two", at=9.0)

    assert _run(factory, script) == {"/one": 4.0, "/two": 8.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_chunked_body_is_stamped_by_the_read_of_its_last_chunk(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    async def script(conn: _Connection) -> None:
        conn.read(1.0, _chunked_head("/one") + _chunk(b'{"prompt": '))
        conn.read(2.0, _chunk(b'"hi"}'))
        conn.read(3.0, LAST_CHUNK[:3])  # the body's end split too: it ends at 4
        conn.read(4.0, LAST_CHUNK[3:])
        await conn.answer("/one", at=5.0)
        conn.read(8.0, _chunked_head("/two") + _chunk(b'{"prompt": "hi"}') + LAST_CHUNK)
        await conn.answer("/two", at=9.0)

    assert _run(factory, script) == {"/one": 4.0, "/two": 8.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_pipelined_request_whose_body_trickles_in_is_stamped_by_its_last_byte(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    one, two = _request("/one"), _request("/two")

    async def script(conn: _Connection) -> None:
        # /two's head and part of its body behind the whole of /one, the rest at 3: /one
        # is answered at 5, and /two (parsed by h11 only then) still ends at 3.
        conn.read(1.0, one + two[:-5])
        conn.read(3.0, two[-5:])
        await conn.answer("/one", at=5.0)
        await conn.answer("/two", at=6.0)

    assert _run(factory, script) == {"/one": 1.0, "/two": 3.0}


@pytest.mark.parametrize("factory", PROTOCOLS)
def test_a_request_ending_in_the_read_that_begins_the_next_takes_that_reads_time(
        factory: Callable[[Clock], type[asyncio.Protocol]]) -> None:
    one, two = _request("/one"), _request("/two")

    async def script(conn: _Connection) -> None:
        conn.read(1.0, one[:-3])
        conn.read(2.0, one[-3:] + two[:20])
        conn.read(3.0, two[20:])
        await conn.answer("/one", at=5.0)
        await conn.answer("/two", at=6.0)

    assert _run(factory, script) == {"/one": 2.0, "/two": 3.0}


def test_a_stamp_read_around_a_delay_errs_later_never_earlier() -> None:
    """The kernel's lag is read first, then the clock: a preemption between the two (or a
    slow getsockopt) moves the stamp later, never earlier (a TTFT reported too high)."""
    from slopilot.engine.http_arrival import _ReadTime

    now = [100.0]

    def lag() -> float:  # the getsockopt, the thread preempted 5 s inside it
        now[0] += 5.0
        return 2.0

    read_time = _ReadTime(lambda: now[0], backdate=True)
    read_time.lag = lag
    # The kernel measured its 2 s somewhere in 100..105: the bytes came in 98..103; the
    # stamp takes the latest, where reading the clock first took the earliest.
    assert read_time() == 103.0
