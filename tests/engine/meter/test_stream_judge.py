"""The meter's reading of a stream: SSE as any client reads it, whatever its framing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slopilot.engine.meter.stream_judge import StreamJudge, Verdict, Wire
from slopilot.engine.slo import ClassSLO

SLO = ClassSLO(ttft_p99_ms=500, tbt_p99_ms=100)


def data(text: str | None = None, finish: str | None = None, **delta: Any) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if delta:
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return b"data: " + json.dumps({"id": "x", "model": "m", "choices": [choice]}).encode()


def judged(pieces: list[tuple[bytes, float]], now: float) -> list[Verdict]:
    judge = StreamJudge(SLO, 0.0)
    for piece, at in pieces:
        judge.written(piece, at)
    return judge.verdicts(now)


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_line_end_sse_allows_is_read(end: bytes) -> None:
    """SSE ends a line with CR, LF or CRLF: a stream ended by bare CRs was never read,
    and one that missed was counted with no tokens."""
    got = judged([(data("a") + end * 2, 0.1), (data("b", "stop") + end * 2, 0.15),
                  (b"data: [DONE]" + end * 2, 0.16)], 0.2)
    assert got == [Verdict(True, 2)]


def test_an_event_end_split_between_cr_and_lf_is_read_when_its_cr_arrives() -> None:
    """The client's parser ends the line at the CR; the meter waited for the next event
    and stamped the first token 0.8 s late: a met stream judged missed."""
    got = judged([(data("a", "stop") + b"\r\n\r", 0.1), (b"\n", 0.1),
                  (b": keep-alive\r\n\r\n", 0.9), (b"data: [DONE]\r\n\r\n", 0.9)], 0.9)
    assert got == [Verdict(True, 1)]
    got = judged([(data("a") + b"\r\n\r", 0.1), (b"\n", 0.1),
                  (data("b", "stop") + b"\r\n\r\n", 0.15), (b"data: [DONE]\r\n\r\n", 0.16)],
                 0.2)
    assert got == [Verdict(True, 2)]


def test_an_event_in_many_pieces_and_many_events_in_one_are_read() -> None:
    whole = data("a") + b"\n\n" + data("b") + b"\n\n"
    pieces = [(whole[i:i + 7], 0.1) for i in range(0, len(whole), 7)]
    pieces += [(data("c", "stop") + b"\n\n" + b"data: [DONE]\n\n", 0.15)]
    assert judged(pieces, 0.2) == [Verdict(True, 3)]


def test_an_events_data_lines_are_one_payload() -> None:
    """SSE joins an event's data lines with a newline: JSON split over two lines is one
    chunk (the meter took each line for a chunk, and the stream for unreadable)."""
    first = data("a").decode().removeprefix("data: ")
    split = first.index(",")
    event = f"data: {first[:split + 1]}\ndata:{first[split + 1:]}\n\n".encode()
    got = judged([(event, 0.1), (data("b", "stop") + b"\n\n", 0.15),
                  (b"data: [DONE]\n\n", 0.15)], 0.2)
    assert got == [Verdict(True, 2)]


@pytest.mark.parametrize("delta", [
    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": "weather"}}]},
    {"reasoning": "thinking"}, {"reasoning_content": "thinking"}, {"content": "hi"},
], ids=["tool_calls", "reasoning", "reasoning_content", "content"])
def test_any_generated_delta_is_output(delta: dict[str, Any]) -> None:
    """A chat stream of tool calls carries no content: it was never judged, however late
    its first delta came (3 s against 500 ms)."""
    got = judged([(data(**delta) + b"\n\n", 3.0), (data(**delta) + b"\n\n", 3.05),
                  (data(finish="stop", role="assistant") + b"\n\n", 3.06),
                  (b"data: [DONE]\n\n", 3.07)], 3.1)
    assert got == [Verdict(False, 2)]


def test_a_delta_with_only_a_role_or_empty_fields_is_no_token() -> None:
    got = judged([(data(role="assistant") + b"\n\n", 0.05),
                  (data(content="", tool_calls=[]) + b"\n\n", 0.08),
                  (data(content="a", finish="stop") + b"\n\n", 0.1),
                  (b"data: [DONE]\n\n", 0.1)], 0.2)
    assert got == [Verdict(True, 1)]


def test_a_responses_events_type_is_its_json_type_else_its_event_name() -> None:
    """The OpenAI client dispatches on the JSON's ``type``; an event without one is read
    by its SSE ``event:`` name, as vLLM names every event (``_convert_stream_to_sse_events``),
    so a server that writes the type only there is judged all the same."""
    judge = StreamJudge(SLO, 0.0, wire=Wire.RESPONSES)
    judge.written(b'event: response.output_text.delta\r\ndata: {"delta": "a"}\r\n\r\n', 0.1)
    judge.written(b'event: ignored\ndata: {"type": "response.output_text.delta", '
                  b'"delta": "b"}\n\n', 0.15)
    judge.written(b'event: response.completed\ndata: {"response": {"status": "completed"}}'
                  b'\n\n', 0.15)
    assert judge.verdicts(0.2) == [Verdict(True, 2)]  # no usage: its deltas counted


@pytest.mark.parametrize("reason", [[], {"a": 1}, ["max_output_tokens"]],
                         ids=["list", "object", "in-a-list"])
def test_an_incomplete_reason_of_another_kind_is_no_limit(reason: Any) -> None:
    """An upstream's ``incomplete_details.reason`` that is no string (vLLM writes one): the
    answer cut short, as for any reason but a limit. Looked up in the set of limits, a
    list or object raised, and the meter's relay of the stream with it."""
    judge = StreamJudge(SLO, 0.0, wire=Wire.RESPONSES)
    judge.written(b'data: {"type": "response.output_text.delta", "delta": "a"}\n\n', 0.9)
    judge.written(b'data: {"type": "response.completed", "response": {"status": '
                  b'"incomplete", "incomplete_details": {"reason": ' +
                  json.dumps(reason).encode() + b"}}}\n\n", 1.0)
    assert judge.verdicts(1.0) == [Verdict(False, 1)]  # cut short, its first token late


def test_choices_that_never_came_are_judged_as_one_verdict_without_an_object_each() -> None:
    """A stream cut short before a batch's choices came: each such choice is judged alike
    (no first token by the end), so they stand as one verdict of their count. Judged one
    ``_Choice`` each, a million took 3 s of the proxy's loop and about 180 MB to say
    nothing (0 verdicts, the TTFT target not yet past); ``n`` times a list of prompts
    makes that many from a body of a few KB."""
    import tracemalloc

    tracemalloc.start()
    try:
        early = StreamJudge(SLO, 0.0, choices=1_000_000).verdicts(0.1)
        late = StreamJudge(SLO, 0.0, choices=1_000_000).verdicts(1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert early == []
    assert [(v.met, v.tokens, v.choices) for v in late] == [(False, 0, 1_000_000)]
    judge = StreamJudge(SLO, 0.0, choices=3)
    judge.written(data("a", "stop") + b"\n\n", 0.1)
    assert judge.verdicts(1.0) == [Verdict(True, 1), Verdict(False, 0, choices=2)]
