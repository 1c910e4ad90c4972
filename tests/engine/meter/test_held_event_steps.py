"""An SSE event up to ``MAX_EVENT_BYTES`` is held whole and parsed once it ends, in steps
of at most a read's bytes, the meter's event loop let run between them, as a longer
event's reader is (``test_long_event_steps``).

A Responses ``response.completed`` with logprobs, or a completions ``echo`` chunk with a
prompt's, is one for any client that asks: just under 1 MiB, parsed by ``json.loads`` in
one go, it held every other stream the meter relays for 8-35 ms (docs/benchmarks.md, "An
event past 1 MiB"), more than an event past 1 MiB since it is read in steps. What a step
costs is measured by its work, not its time: the bytes the judge parsed (``json.loads``,
from its own modules) or handed a long event's reader between two turns of the loop. And
it is judged as parsed whole, though only what the judge reads is kept of it (``READS``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter import stream_judge
from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.meter.long_event import OUTPUT_FIELDS
from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES, STEP_BYTES, StreamJudge, Verdict
from slopilot.engine.meter.stream_judge import Wire as WireKind
from slopilot.engine.request import Priority
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.test_long_event_steps import ReaderSpy, TurningVLLM
from tests.engine.meter.test_long_events import READ, SLO, echo, prompt_logprobs, reads
from tests.engine.meter.test_meter import counted, meter_for
from tests.engine.meter.test_meter_vllm_wire import MET

JUDGE_MODULES = frozenset({"slopilot.engine.meter.stream_judge",
                           "slopilot.engine.meter.json_steps",
                           "slopilot.engine.meter.json_shells",
                           "slopilot.engine.meter.json_tokens"})
"""Where the judge parses an event's data (``json_paths`` parses only the few values it
reads, inside the long reader's feed, counted as fed)."""
TOKENS = 15_000
held_echo = echo(" ".join(f"w{i}" for i in range(TOKENS)), prompt_logprobs(TOKENS))
"""A completions ``echo`` whose first chunk is just under 1 MiB."""


def held_completed(entries: int = 6_000) -> bytes:
    """vLLM's ``response.completed`` of an answer of 3 tokens with ``entries`` logprobs
    (``include: ["message.output_text.logprobs"]``): just under 1 MiB."""
    s = wire.ResponsesStream()
    s.seq = 5
    event = json.loads(s.completed(3).split(b"data: ", 1)[1])
    event["response"]["output"] = [{
        "type": "message", "id": "msg_7", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "abc", "annotations": [],
                     "logprobs": [{"token": f" w{i}", "logprob": -1.25, "bytes": [32, 119],
                                   "top_logprobs": [{"token": " v", "logprob": -2.5,
                                                     "bytes": [32, 118]}]}
                                  for i in range(entries)]}]}]
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
    return b"event: response.completed\ndata: " + data + b"\n\n"


def responses_stream() -> list[bytes]:
    s = wire.ResponsesStream()
    return [s.created(), s.message_added(), s.text("a"), s.text("bc"), held_completed()]


class WorkSpy(ReaderSpy):
    """The bytes each structural reader was handed and the judge parsed, by the turn of
    the loop it was in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__(monkeypatch)
        loads = json.loads

        def counted_loads(s: str | bytes, *args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_globals.get("__name__") in JUDGE_MODULES:
                self.fed[self.turn] += len(s)
            return loads(s, *args, **kwargs)

        monkeypatch.setattr(json, "loads", counted_loads)


def test_the_events_are_held_and_long() -> None:
    """Held whole (not past the bound), and many steps long."""
    for event in (held_echo(False, True)[0], responses_stream()[-1]):
        assert 8 * STEP_BYTES < len(event) <= MAX_EVENT_BYTES


def test_a_held_events_parse_holds_the_loop_for_a_read_at_most(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An echo's first chunk of just under 1 MiB, through the meter read by read: at most
    ``READ`` bytes parsed in any one turn of the loop, the whole event parsed, and the
    stream judged and passed on as in one go."""
    upstream, now = TurningVLLM(held_echo, READ), [0.0]
    meter = meter_for(tmp_path, upstream, now)
    spy = WorkSpy(monkeypatch)
    first = len(held_echo(False, True)[0])

    assert spy.echo_through(meter, now) == b"".join(held_echo(False, False))
    assert counted(meter) == {MET: (1, 3)}
    assert sum(spy.fed.values()) > first - 2 * READ  # the event's data, all of it parsed
    assert max(spy.fed.values()) <= READ


@pytest.mark.parametrize("read", [4093, READ, 1 << 30], ids=["4k", "64k", "whole"])
def test_a_judge_parses_a_held_event_in_steps_of_a_read_at_most(
        read: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``StreamJudge.read_steps`` on a Responses stream whose ``response.completed`` is
    just under 1 MiB: at most ``STEP_BYTES`` parsed between two steps, however the reads
    come, and the verdicts of ``written``."""
    timed = [(piece, at) for event, at in zip(responses_stream(), [0.05, 0.2, 0.2, 0.25, 0.3],
                                              strict=True) for piece in reads(event, read)]
    whole = StreamJudge(SLO, 0.0, wire=WireKind.RESPONSES)
    for piece, at in timed:
        whole.written(piece, at)
    spy = WorkSpy(monkeypatch)
    stepped = StreamJudge(SLO, 0.0, wire=WireKind.RESPONSES)
    spy.read_in_steps(stepped, timed)
    assert stepped.verdicts(1.0) == whole.verdicts(1.0) == [Verdict(True, 3)]
    assert sum(spy.fed.values()) > 8 * STEP_BYTES  # the event parsed, all of it
    assert max(spy.fed.values()) <= STEP_BYTES == READ


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() \
        + b"\n\n"


def _chat(choices: list[dict[str, Any]], **fields: Any) -> bytes:
    return _sse({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1,
                 "model": "llama", "choices": choices, **fields})


def _delta(content: str, index: int = 0, finish: str | None = None,
           **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": {"content": content}, "logprobs": None,
            "finish_reason": finish, **fields}


def _merged_logprobs() -> list[bytes]:
    """A busy server's chunk of 2,000 tokens with their ``top_logprobs``, no usage: its
    tokens are its logprobs' entries (which a long event's reader does not count)."""
    top = [{"token": f" t{j}", "logprob": -2.5, "bytes": [32, 116]} for j in range(5)]
    entries = [{"token": " w", "logprob": -1.25, "bytes": [32, 119], "top_logprobs": top}
               for _ in range(2_000)]
    return [wire.chat_role(), _chat([_delta(" w" * 2_000) | {"logprobs": {"content": entries}}]),
            _chat([_delta(".", finish="stop")]), wire.DONE]


def _token_ids() -> list[bytes]:
    """``return_token_ids``: a chunk of 30,000 tokens by its ids."""
    return [_chat([_delta("w " * 30_000, token_ids=list(range(30_000)))]),
            _chat([_delta(".", finish="length", token_ids=[7])]), wire.DONE]


def _many_choices() -> list[bytes]:
    """``n`` = 12 in one chunk (vLLM writes one a chunk; a long event's reader reads 8)."""
    return [_chat([_delta("x" * 10_000, index=i) for i in range(12)]),
            _chat([_delta("y", index=i, finish="length") for i in range(12)]), wire.DONE]


def _written_twice() -> list[bytes]:
    """A chunk whose ``choices`` and ``usage`` are written twice: the last of each."""
    first = _chat([_delta("a" * 100_000)])[:-3]
    return [first + b',"choices":[' + json.dumps(_delta("b", index=1)).encode() +
            b'],"usage":{"completion_tokens":2},"usage":{"completion_tokens":4}}\n\n',
            _chat([_delta("c", index=1, finish="stop")]), wire.DONE]


def _failed() -> list[bytes]:
    return [_chat([_delta("a")]), _sse({"error": {"message": "x" * 200_000}}), wire.DONE]


def _no_json() -> list[bytes]:
    return [_chat([_delta("a")]), _chat([_delta("b" * 200_000)])[:-4] + b",}\n\n", wire.DONE]


def _responses(last: bytes) -> list[bytes]:
    s = wire.ResponsesStream()
    return [s.created(), s.message_added(), s.text("a"), s.text("bc"), last]


def _delta_logprobs() -> list[bytes]:
    """A Responses delta of 3,000 merged tokens, by its logprobs."""
    s = wire.ResponsesStream()
    entries = [{"token": " w", "logprob": -1.25, "bytes": [32, 119], "top_logprobs": []}
               for _ in range(3_000)]
    return [s.created(), s.message_added(), s.text(" w" * 3_000, logprobs=entries),
            s.completed(3_001)]


def _incomplete() -> list[bytes]:
    event = json.loads(held_completed().split(b"data: ", 1)[1])
    event["response"] |= {"status": "incomplete",
                          "incomplete_details": {"reason": "max_output_tokens"}}
    return _responses(b"event: response.completed\ndata: " + json.dumps(event).encode() +
                      b"\n\n")


HELD = {
    "echo": (lambda: held_echo(False, False), WireKind.CHOICES, 1),
    "merged-logprobs": (_merged_logprobs, WireKind.CHOICES, 1),
    "token-ids": (_token_ids, WireKind.CHOICES, 1),
    "many-choices": (_many_choices, WireKind.CHOICES, 12),
    "written-twice": (_written_twice, WireKind.CHOICES, 2),
    "failed": (_failed, WireKind.CHOICES, 1),
    "no-json": (_no_json, WireKind.CHOICES, 1),
    "completed": (lambda: _responses(held_completed()), WireKind.RESPONSES, 1),
    "incomplete": (_incomplete, WireKind.RESPONSES, 1),
    "delta-logprobs": (_delta_logprobs, WireKind.RESPONSES, 1),
}


class Seen(ClientLatency):
    """Each observation, in order."""

    def __init__(self) -> None:
        super().__init__(Priority.P0)
        self.seen: list[tuple[str, Any]] = []

    def first_token(self, seconds: float) -> None:
        self.seen.append(("ttft", seconds))

    def token_gaps(self, gaps: list[float]) -> None:
        self.seen.append(("gaps", tuple(gaps)))


Judged = tuple[list[Verdict], list[tuple[str, Any]], str | None]
"""A stream's verdicts, each observation of its latencies in order, and its model."""


def judged_in_steps(pieces: list[tuple[bytes, float]], step: int, *, choices: int,
                    max_tokens: int, wire: WireKind) -> Judged:
    """``pieces`` judged by ``StreamJudge.read_steps`` in steps of ``step`` bytes."""
    with mock.patch.object(stream_judge, "STEP_BYTES", step):
        latency = Seen()
        judge = StreamJudge(SLO, 0.0, choices=choices, max_tokens=max_tokens,
                            latency=latency, wire=wire)
        for piece, at in pieces:
            for _ in judge.read_steps(piece, at):
                pass
        return judge.verdicts(2.0), latency.seen, judge.model


@pytest.mark.parametrize("case", HELD)
def test_a_held_event_is_judged_as_parsed_whole(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's events a client may have it write just under the bound (and an upstream's
    no vLLM writes): the verdicts, token counts, first tokens, gaps and model of a
    judge that parses each event whole in one step (as before ``json_steps``), in steps
    of a read and in steps of 48 bytes."""
    render, kind, choices = HELD[case]
    events = render()
    assert STEP_BYTES < max(map(len, events)) <= MAX_EVENT_BYTES
    timed = [(piece, 0.1 + 0.05 * i) for i, event in enumerate(events)
             for piece in reads(event, 4093)]

    def judged(step: int) -> Judged:
        return judged_in_steps(timed, step, choices=choices, max_tokens=40_000, wire=kind)

    whole = judged(1 << 30)
    assert whole == judged(STEP_BYTES) == judged(48)
    assert whole[0] or case in ("failed", "no-json")


anything = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) |
                        st.sampled_from([1e3, -0.0, 2.5, "", "x", "stop", "length"]),
                        lambda inner: st.lists(inner, max_size=3) |
                        st.dictionaries(st.sampled_from(["a", "content", "tokens"]), inner,
                                        max_size=2), max_leaves=6)
"""Values of every kind, where the judge reads one kind."""


ABSENT = object()


def objects(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of ``fields``, each there or not, mostly of its kind (else anything); and
    other keys at times: a list, and the same keys in another place."""
    return st.tuples(
        st.fixed_dictionaries({k: st.one_of(*[v] * 4, anything, *[st.just(ABSENT)] * 2)
                               for k, v in fields.items()}),
        st.fixed_dictionaries({}, optional={
            "junk": st.lists(st.integers(), max_size=40),
            "x": st.fixed_dictionaries({k: anything for k in fields})}),
    ).map(lambda both: {k: v for k, v in both[0].items() if v is not ABSENT} | both[1])


entries = st.lists(st.just({"token": " w", "logprob": -1.0}), max_size=5)
texts = st.sampled_from(["", "ab"])
choice_chunks = objects({
    "model": st.just("llama"), "error": st.just({"message": "x"}) | st.just(ABSENT),
    "usage": objects({"completion_tokens": st.integers(0, 9)}),
    "choices": st.lists(objects({
        "index": st.integers(0, 1), "finish_reason": st.sampled_from(["stop", None]),
        "text": texts, "token_ids": st.lists(st.integers(), max_size=4),
        "logprobs": objects({"content": entries, "tokens": entries}),
        "delta": objects(dict.fromkeys(OUTPUT_FIELDS, texts))}), min_size=1, max_size=2)})


def response_events(types: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return objects({
        "type": st.sampled_from(types), "delta": texts, "logprobs": entries,
        "item": objects({"type": st.just("function_call")}),
        "response": objects({
            "model": st.just("llama"), "status": st.sampled_from(["completed", "incomplete",
                                                                  "failed"]),
            "incomplete_details": objects({"reason": st.just("max_output_tokens")}),
            "usage": objects({"output_tokens": st.integers(0, 9)})})})


streams = {
    WireKind.CHOICES: st.lists(choice_chunks, min_size=1, max_size=4),
    WireKind.RESPONSES: st.tuples(
        st.lists(response_events(["response.output_text.delta", "response.reasoning_text.delta",
                                  "response.output_item.added"]), max_size=3),
        response_events(["response.completed", "response.incomplete", "response.failed",
                         "error", "response.output_text.delta"])).map(
        lambda both: [*both[0], both[1]]),
}
"""Streams of events of the keys the judge reads: for Responses, deltas and an end."""


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(list(WireKind)), st.integers(1, 2), st.booleans(), st.data())
def test_what_a_held_event_keeps_is_all_the_judge_reads(
        kind: WireKind, choices: int, done: bool, data: st.DataObject) -> None:
    """Any events of the keys the judge reads, each of any kind of value (and others):
    kept as ``READS`` says in steps of 48 bytes, they are judged as parsed whole (same
    verdicts, token counts, first tokens, gaps and model)."""
    events = data.draw(streams[kind], label="events")
    pieces = [(_sse(event), 0.1 + 0.3 * i) for i, event in enumerate(events)]
    if done and kind is WireKind.CHOICES:
        pieces.append((wire.DONE, 2.0))

    def judged(step: int) -> Judged:
        return judged_in_steps(pieces, step, choices=choices, max_tokens=8, wire=kind)

    assert judged(1 << 30) == judged(48)
