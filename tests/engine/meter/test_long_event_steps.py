"""An SSE event past ``MAX_EVENT_BYTES`` is read in steps of at most a read's bytes, the
meter's event loop let run between them: it relays every stream, and holds them all while
one step runs.

The event's first MiB is held whole until the event is known to be long, then handed to
its structural reader (``json_paths``): in one go, that was up to 20 ms of every other
stream's tokens stalled, once per long event (docs/benchmarks.md, "An event past 1 MiB").
What a step costs is measured by its work, not its time: the bytes the reader was handed
between two turns of the loop.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from slopilot.engine.meter.json_paths import PathScan
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES, STEP_BYTES, StreamJudge, Verdict
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_long_events import ECHO, READ, SLO, echo, prompt_logprobs, reads
from tests.engine.meter.test_meter import Client, Upstream, counted, meter_for, run
from tests.engine.meter.test_meter_token_counts import Render, asked
from tests.engine.meter.test_meter_vllm_wire import MET

TOKENS = 64_000
long_echo = echo(" ".join(f"w{i}" for i in range(TOKENS)), prompt_logprobs(TOKENS))
"""A completions ``echo`` whose first chunk is several MiB."""


class TurningVLLM(Upstream):
    """A stand-in vLLM that writes the stream its forwarded request asks for in reads of
    ``read`` bytes, the loop taking a turn between two, as a socket's reads do."""

    def __init__(self, render: Render, read: int) -> None:
        super().__init__()
        self.render, self.read = render, read

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        stream = b"".join(self.render(*asked(json.loads(request.content))))

        async def body() -> AsyncIterator[bytes]:
            for piece in reads(stream, self.read):
                yield piece
                await asyncio.sleep(0)

        return httpx.Response(200, headers={"content-type": wire.CONTENT_TYPE},
                              content=body())


class ReaderSpy:
    """The bytes each structural reader was handed, by the turn of the loop it was in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.turn = 0
        self.fed: collections.Counter[int] = collections.Counter()
        self.on_feed: list[Callable[[], object]] = []
        feed = PathScan.feed

        def counted_feed(scan: PathScan, data: bytes) -> None:
            self.fed[self.turn] += len(data)
            for hook in self.on_feed:
                hook()
            feed(scan, data)

        monkeypatch.setattr(PathScan, "feed", counted_feed)

    async def count_turns(self, until: asyncio.Event) -> None:
        # Each task steps once a turn of the loop at most, in the order it was woken: so
        # between two steps of this one, the meter's forwarding took one step at most.
        while not until.is_set():
            self.turn += 1
            await asyncio.sleep(0)

    def read_in_steps(self, judge: StreamJudge, timed: list[tuple[bytes, float]]) -> None:
        """``timed``'s pieces to ``judge`` in its steps, a turn of the loop after each
        step and between two pieces (the caller's next read)."""
        for piece, at in timed:
            for _ in judge.read_steps(piece, at):
                self.turn += 1
            self.turn += 1

    def echo_through(self, meter: Any, now: list[float]) -> bytes:
        """The ``ECHO`` request through ``meter``, the turns of the loop counted meanwhile:
        the bytes its client got."""
        async def go() -> bytes:
            done = asyncio.Event()
            turns = asyncio.ensure_future(self.count_turns(done))
            try:
                _, _, got = await Client(meter, now).request(
                    "POST", "/v1/completions", ECHO, written_at=[0.2])
            finally:
                done.set()
                await turns
            return got

        return run(go)


def test_a_long_events_reader_holds_the_loop_for_a_read_at_most(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first MiB of a several-MiB event, then the rest of it read by read: at most
    ``READ`` bytes to the reader in any one turn of the loop, the whole event read, and
    the stream judged and passed on as in one go."""
    upstream, now = TurningVLLM(long_echo, READ), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    spy = ReaderSpy(monkeypatch)
    first = len(long_echo(False, True)[0])
    assert first > 3 * MAX_EVENT_BYTES

    assert spy.echo_through(meter, now) == b"".join(long_echo(False, False))
    assert counted(meter) == {MET: (1, 3)}
    assert sum(spy.fed.values()) > first - 2 * READ  # the event's data, all of it read
    assert max(spy.fed.values()) <= READ


def test_a_client_gone_during_a_long_read_has_the_verdict_of_a_read_in_one_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole stream in one read, and its client gone as the reader starts on it: the
    read goes on to the read's end, the stream's finish included, which its client got.
    Left where the client went, its first chunk alone read, the stream was cut short
    and (its first token on time) not judged."""
    upstream, now = TurningVLLM(long_echo, 1 << 30), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    spy = ReaderSpy(monkeypatch)
    client = Client(meter, now)
    spy.on_feed.append(client.leave.set)

    async def go() -> bytes:
        _, _, got = await client.request("POST", "/v1/completions", ECHO,
                                         written_at=[0.2, 0.2])
        return got

    assert run(go) == b"".join(long_echo(False, False))
    assert counted(meter) == {MET: (1, 3)}


@pytest.mark.parametrize("read", [4093, READ, 1 << 30], ids=["4k", "64k", "whole"])
def test_a_judge_reads_a_long_event_in_steps_of_a_read_at_most(
        read: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``StreamJudge.read_steps``: at most ``STEP_BYTES`` to the reader between two steps,
    however the reads come, and the verdicts of ``written``."""
    timed = [(piece, at) for event, at in zip(long_echo(False, True), [0.2, 0.25, 0.3, 0.3],
                                              strict=True) for piece in reads(event, read)]
    whole = StreamJudge(SLO, 0.0)
    for piece, at in timed:
        whole.written(piece, at)
    spy = ReaderSpy(monkeypatch)
    stepped = StreamJudge(SLO, 0.0)
    spy.read_in_steps(stepped, timed)
    assert stepped.verdicts(1.0) == whole.verdicts(1.0) == [Verdict(True, 3)]
    assert sum(spy.fed.values()) > 3 * MAX_EVENT_BYTES  # the event read, all of it
    assert max(spy.fed.values()) <= STEP_BYTES == READ
