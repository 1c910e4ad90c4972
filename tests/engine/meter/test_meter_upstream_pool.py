"""The meter's connections to vLLM: as many streams at once as its clients open.

vLLM runs up to ``max_num_seqs`` requests at once (the tuner draws it up to 1,024) and
queues the rest in its own scheduler, by priority. The meter's upstream client is the
one path to it: a cap on that client's connections is a queue in front of vLLM that no
knob reaches and no vLLM metric shows.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.verdicts import Verdicts
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_meter import SLO, STREAM, Client, counted
from tests.support.waits import HANG_GUARD_S

STREAMS = 128
"""More than httpx's default pool (100 connections): a max_num_seqs the tuner draws."""


class _HeldEngine:
    """A stand-in vLLM on a real socket: each request's head and body are read, then its
    one-token stream waits until the test lets every stream go."""

    def __init__(self) -> None:
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        self.arrived += 1
        if self.arrived == STREAMS:
            self.all_in.set()
        await self.release.wait()
        body = wire.completion(0, "a", finish="stop") + wire.DONE
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + wire.CONTENT_TYPE.encode() +
                     b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()


def test_every_stream_reaches_the_engine_at_once(tmp_path: Path) -> None:
    """httpx's default pool opens 100 connections: the 101st stream through the meter
    waited inside the meter for one of them to end, whatever vLLM's max_num_seqs, so no
    trial above 100 could run more at once, and vLLM's queue (and its priorities) never
    saw them."""
    slo_file = tmp_path / "slo.json"
    slo_file.write_text(json.dumps(SLO))
    now = [0.0]

    async def go() -> None:
        engine = _HeldEngine()
        server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        meter = Meter(f"http://127.0.0.1:{port}", SLOWatch(slo_file, Verdicts()),
                      Priority.P0, clock=lambda: now[0])
        streams = [asyncio.ensure_future(Client(meter, now).request(
            "POST", "/v1/completions", STREAM)) for _ in range(STREAMS)]
        try:
            await asyncio.wait_for(engine.all_in.wait(), HANG_GUARD_S)
        except TimeoutError:
            raise AssertionError(f"only {engine.arrived} of {STREAMS} streams reached "
                                 "the engine") from None
        finally:
            engine.release.set()
            await asyncio.wait_for(asyncio.gather(*streams), HANG_GUARD_S)
            await meter.client.aclose()
            server.close()
            await server.wait_closed()
        assert counted(meter) == {(Priority.P0, meter.slo.current().p0.label, True):
                                  (STREAMS, STREAMS)}

    asyncio.run(go())


def test_an_idle_connection_to_vllm_is_dropped_before_vllm_drops_it(tmp_path: Path) -> None:
    """httpx keeps an idle connection 5 s by default, and vLLM's server closes one after
    5 s idle: a request sent on it as vLLM closed it failed, a 502 for a request vLLM
    would have served. The meter lets go of its idle connections first."""
    from slopilot.engine.meter.proxy import UPSTREAM_IDLE_S, VLLM_KEEP_ALIVE_S

    slo_file = tmp_path / "slo.json"
    slo_file.write_text(json.dumps(SLO))
    meter = Meter("http://127.0.0.1:9", SLOWatch(slo_file, Verdicts()), Priority.P1)
    pool = meter.client._transport._pool  # type: ignore[attr-defined]
    assert pool._keepalive_expiry == UPSTREAM_IDLE_S <= VLLM_KEEP_ALIVE_S / 2
    asyncio.run(meter.client.aclose())
