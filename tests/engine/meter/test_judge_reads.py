"""The judge reads of an event's JSON only what ``READS`` keeps of it.

A held event longer than what is left of a step is parsed by ``json_steps``, which keeps
only ``READS[wire]`` of it; a shorter one, by ``json.loads``, whole. A field the judge
reads that ``READS`` does not keep is there in the one and missing in the other: the
same stream judged two ways, depending on how the reads split it. So what the judge
reads is made visible (``recorded_reads``: its parse's value logs every lookup) on
vLLM's streams of every kind (``vllm_streams``), and held against ``READS``: by place
(a field read where it is absent too), by what it saw (the same reads, the same answers,
on the value kept), and by the judge's answers (verdicts, tokens, first tokens, gaps,
model) with every event parsed whole and in steps.
"""

from __future__ import annotations

import json
import types
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slopilot.engine.meter import json_steps, stream_judge
from slopilot.engine.meter.json_steps import COUNT, WHOLE, Keep, project
from slopilot.engine.meter.stream_judge import READS, StreamJudge, Verdict, Wire
from tests.engine.meter import vllm_wire as wire
from tests.engine.meter.recorded_reads import Kind, Reads, kept, places, recorded
from tests.engine.meter.test_held_event_steps import Seen
from tests.engine.meter.test_long_events import SLO
from tests.engine.meter.vllm_streams import (
    Stream,
    chat_logprobs,
    completion_logprobs,
    edited,
    streams,
)

Judged = tuple[list[Verdict], list[tuple[str, Any]], str | None]


def judged(stream: Stream, step: int) -> Judged:
    """The stream's verdicts, first tokens and gaps, and model, judged in steps of
    ``step`` bytes (each event read as one piece, a turn of the loop apart)."""
    kind, n, events = stream
    with mock.patch.object(stream_judge, "STEP_BYTES", step):
        latency = Seen()
        judge = StreamJudge(SLO, 0.0, choices=n, max_tokens=8, latency=latency, wire=kind)
        for i, event in enumerate(events):
            for _ in judge.read_steps(event, 0.1 + 0.05 * i):
                pass
        return judge.verdicts(2.0), latency.seen, judge.model


def reads_of(stream: Stream, keep: Keep | None = None) -> tuple[Reads, Judged]:
    """What the judge reads of each event's JSON, each parsed whole (``keep``: only what it
    keeps of it, as ``json_steps`` keeps it), and its answers."""
    reads = Reads()

    def loads(payload: bytes) -> Any:
        value = json.loads(payload)
        return recorded(value if keep is None else project(value, keep), reads)

    with mock.patch.object(stream_judge, "json", types.SimpleNamespace(loads=loads)):
        answers = judged(stream, 1 << 30)
    return reads, answers


def missing(kind: Wire, reads: Reads) -> list[str]:
    return sorted({str(read) for read in reads if not kept(READS[kind], read)})


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(streams)
def test_the_judge_reads_only_what_a_held_event_keeps(stream: Stream) -> None:
    """vLLM's streams of every kind: each field the judge reads of an event, whether the
    event has it or not, ``READS`` keeps; and on the value kept the judge makes the same
    reads and sees the same at each."""
    kind = stream[0]
    reads, answers = reads_of(stream)
    assert reads, "no read recorded: the judge no longer parses with stream_judge.json.loads"
    assert not missing(kind, reads), (
        f"the judge reads {missing(kind, reads)} of a {kind} event, which "
        f"stream_judge.READS does not keep: an event parsed in steps (json_steps) would "
        f"lack it. Add it to READS[{kind}]")
    kept_reads, kept_answers = reads_of(stream, READS[kind])
    assert kept_reads == reads
    assert kept_answers == answers


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(streams, st.integers(32, 160))
def test_a_stream_is_judged_alike_its_events_parsed_whole_or_in_steps(
        stream: Stream, step: int) -> None:
    """The judge's answers with each event parsed whole by ``json.loads`` and in steps of
    ``step`` bytes, ``READS`` kept (vLLM's events but ``[DONE]`` are mostly longer)."""
    with mock.patch.object(json_steps, "loads", wraps=json_steps.loads) as stepped:
        assert judged(stream, step) == judged(stream, 1 << 30)
    assert stepped.called or not stream[2]


@pytest.mark.parametrize(("reader", "keep", "held"), [
    (lambda v: len(v["a"]), Keep(keys={"a": COUNT}), True),
    (lambda v: list(v["a"]), Keep(keys={"a": COUNT}), False),
    (lambda v: [x["y"] for x in v["a"]], Keep(keys={"a": Keep(items=Keep(keys={"y": WHOLE}))}),
     True),
    (lambda v: bool(v["b"]), Keep(keys={"a": WHOLE, "b": Keep(keys={})}), False),
    (lambda v: "b" in v, Keep(keys={"a": WHOLE, "b": Keep(keys={})}), True),
    (lambda v: v.get("c"), Keep(keys={"a": WHOLE}), False),
    (lambda v: v["b"]["x"], Keep(keys={"b": Keep(items=COUNT)}), True),
    (lambda v: dict(v["b"].items()), Keep(keys={"b": Keep(keys={"x": WHOLE})}), False),
], ids=["count", "items-of-a-count", "items-keys", "truth-of-an-object", "key-only",
        "absent-key", "object-where-an-array-is-kept", "all-of-an-object"])
def test_a_read_is_held_as_json_steps_keeps_its_place(
        reader: Any, keep: Keep, held: bool) -> None:
    """The guard's own rule (``recorded_reads.kept``): a read it holds sees the same on
    the value kept (``json_steps.project``); one it does not may not (and an absent key's
    read is no read of nothing: ``c`` would be dropped where it is there)."""
    value = {"a": [{"y": 1, "z": 2}, {"y": 3}], "b": {"x": 1, "w": [4]}}
    reads, kept_reads = Reads(), Reads()
    seen = reader(recorded(value, reads))
    assert all(kept(keep, read) for read in reads) is held
    if held:
        assert reader(recorded(project(value, keep), kept_reads)) == seen
        assert kept_reads == reads


def _chat() -> list[bytes]:
    first = wire.chat_delta(content="a b", logprobs=chat_logprobs(["a", " b"], 1),
                            usage=(5, 2))
    ids = edited(wire.chat_delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
                 lambda chunk: chunk["choices"][0].update(token_ids=[7, 8]))
    return [wire.chat_role(usage=(5, 0)), first, ids,
            wire.chat_delta(finish="stop", usage=(5, 4)), wire.chat_usage(5, 4), wire.DONE]


def _completion() -> list[bytes]:
    return [wire.completion(0, "a", logprobs=completion_logprobs(["a"], 0, 1)),
            wire.completion(0, "b", logprobs=completion_logprobs(["b"], 1, 1)),
            wire.error("Request aborted."), wire.DONE]


def _responses() -> list[bytes]:
    s = wire.ResponsesStream()
    return [s.created(), s.function_call_added("f"), s.arguments("{"),
            s.text("a", logprobs=[{"token": "a", "logprob": -0.5}]),
            s.completed(3, status="incomplete")]


CORPUS: list[Stream] = [(Wire.CHOICES, 1, _chat()), (Wire.CHOICES, 1, _completion()),
                        (Wire.RESPONSES, 1, _responses())]
"""vLLM's streams that take each of the judge's reads."""


def test_a_held_event_keeps_no_more_than_the_judge_reads() -> None:
    """Each place ``READS`` names is one the judge reads on some stream of vLLM's: the
    table follows the judge both ways (and the guard above sees its reads)."""
    for kind in Wire:
        read = {r.shape() for stream in CORPUS if stream[0] is kind
                for r in reads_of(stream)[0] if r.kind is Kind.KEY}
        assert set(places(READS[kind])) - {()} - read == set()
