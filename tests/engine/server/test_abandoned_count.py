"""A request whose client got no first token before it ended is counted, per class.

A request queued behind a stall until its client gave up is in no TTFT histogram: no
first chunk was ever written. ``slopilot_requests_abandoned_total`` counts each such
choice (the client left, a drain aborted it, the answer failed), so the rules read it as
a first token never given, beside the refusals (``rules.bucket_rates``); a choice that
got its first token, or finished, is not counted, however it ended.
"""

from __future__ import annotations

import asyncio

import pytest

from slopilot.engine.metric_names import ABANDONED
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.metrics_observer import MetricsObserver
from slopilot.engine.request import FinishReason, Priority
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.logprobs_format import TokenText
from slopilot.engine.server.protocol import CompletionRequest
from slopilot.engine.server.request_stream import RequestStream
from slopilot.engine.server.responses import Delivery, collect, sse_events
from slopilot.engine.server.serving import Prepared, prepare
from tests.engine.helpers import make_engine, make_request
from tests.support.live_server import build_backend


class _Aborts:
    """Stands in for the engine: takes the delivery's aborts."""

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        pass


def _request(*, stream: bool, n: int = 1) -> tuple[Backend, Prepared]:
    backend = build_backend(realtime=False)
    body = CompletionRequest(prompt="one two three", max_tokens=50, ignore_eos=True,
                             stream=stream, n=n)
    return backend, prepare(backend, body, {}, arrival_time=10.0)


async def _leave(delivery: Delivery, stream: bool, *, tokens: int = 0) -> None:
    """The client goes away once ``tokens`` tokens reached the handler (none: while it
    still waits for its first): the route's generator closed, or its body's task
    cancelled, then the response's close."""
    text_of = TokenText(delivery.backend.tokenizer)
    state = delivery.states[0]
    if stream:
        events = sse_events(delivery, text_of)
        if tokens:  # its chunk is written once the response asks for the next
            await anext(events)
        task = asyncio.ensure_future(anext(events))
        while tokens and not state.first_written:
            await asyncio.sleep(0)
    else:
        task = asyncio.ensure_future(collect(delivery, text_of))
        while len(state.token_ids) < tokens:
            await asyncio.sleep(0)
    for _ in range(3):  # the handler waits for output that does not come
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    delivery.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_before_its_first_token_is_counted_once(stream: bool) -> None:
    backend, prep = _request(stream=stream)
    m = backend.metrics

    async def deliver() -> None:
        streams = [RequestStream(c.request, _Aborts()) for c in prep.choices]
        await _leave(Delivery(backend, prep, streams, lambda: 70.0, slo=None), stream)

    asyncio.run(deliver())
    assert m.abandoned() == {Priority.P0: 0, Priority.P1: 1, Priority.P2: 0}
    assert m._ttft[Priority.P1].count == 0  # never observed there: hence the count


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_after_its_first_token_is_not_counted(stream: bool) -> None:
    backend, prep = _request(stream=stream)
    m = backend.metrics

    async def deliver() -> None:
        stream_ = RequestStream(prep.choices[0].request, _Aborts())
        stream_._push(7, None, made_at=10.1)
        delivery = Delivery(backend, prep, [stream_], lambda: 10.2, slo=None)
        await _leave(delivery, stream, tokens=1)

    asyncio.run(deliver())
    assert m.abandoned()[Priority.P1] == 0


def test_a_drained_request_and_each_choice_of_n_are_counted() -> None:
    # A drain past its timeout aborts the requests still waiting: their clients get an
    # end, and no first token.
    backend, prep = _request(stream=True, n=3)
    m = backend.metrics

    async def deliver() -> None:
        streams = [RequestStream(c.request, _Aborts()) for c in prep.choices]
        streams[0]._push(7, FinishReason.LENGTH, made_at=10.1)  # one choice served
        for s in streams[1:]:
            s._push(None, FinishReason.ABORT)  # as AsyncEngine.abort posts it
        delivery = Delivery(backend, prep, streams, lambda: 10.2, slo=None)
        async for _ in sse_events(delivery, TokenText(backend.tokenizer)):
            pass
        delivery.close()

    asyncio.run(deliver())
    assert m.abandoned()[Priority.P1] == 2
    # Their end chunks are no first token: only the served choice's TTFT is observed.
    assert m._ttft[Priority.P1].count == 1


def test_the_counter_is_exported_per_class_from_the_start() -> None:
    m = EngineMetrics("m")
    text = m.render().decode()
    for p in Priority:
        for within in ("false", "true"):
            assert (f'{ABANDONED}{{model_name="m",priority_class="{p.label}",'
                    f'within_ttft_target="{within}"}} 0.0') in text
    m.count_abandoned(Priority.P2)
    m.count_abandoned(Priority.P2, within_target=True)
    m.count_abandoned(Priority.P2, within_target=True)
    text = m.render().decode()
    assert (f'{ABANDONED}{{model_name="m",priority_class="p2",'
            'within_ttft_target="false"} 1.0') in text
    assert (f'{ABANDONED}{{model_name="m",priority_class="p2",'
            'within_ttft_target="true"} 2.0') in text
    assert m.abandoned(within_target=True)[Priority.P2] == 2


def test_where_the_engines_events_are_the_clients_an_abort_before_a_token_counts() -> None:
    """The simulator's path (``observe_delivery``): the engine's abort is the client's."""
    engine = make_engine()
    metrics = EngineMetrics("m")
    engine.observers.append(MetricsObserver(metrics))
    for i, p in enumerate((Priority.P0, Priority.P2)):
        engine.add_request(make_request(f"r{i}", 3, priority=p))
    engine.step()  # both get their first token
    engine.add_request(make_request("late", 3, priority=Priority.P2))
    for rid in ("r0", "late"):
        engine.abort_request(rid)
    assert metrics.abandoned() == {Priority.P0: 0, Priority.P1: 0, Priority.P2: 1}


def test_where_the_engines_events_are_the_clients_one_gone_within_target_is_apart() -> None:
    """With an SLO known, an abort before a first token within the class's TTFT target
    is counted apart: it missed nothing (``ClassSLO.left_within_ttft``)."""
    from slopilot.engine.engine import VirtualClock
    from slopilot.engine.slo import SLOSpec

    engine = make_engine()
    metrics = EngineMetrics("m")
    metrics.set_slo(SLOSpec.from_profile("strict"))
    engine.observers.append(MetricsObserver(metrics))
    engine.add_request(make_request("soon", 3, priority=Priority.P1))
    engine.add_request(make_request("late", 3, priority=Priority.P1))
    engine.abort_request("soon")
    assert isinstance(engine.clock, VirtualClock)
    engine.clock.advance(0.6)  # past P1's 500 ms
    engine.abort_request("late")
    assert metrics.abandoned(within_target=True)[Priority.P1] == 1
    assert metrics.abandoned(within_target=False)[Priority.P1] == 1
