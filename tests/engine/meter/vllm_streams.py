"""Whole streams as vLLM v0.11 writes them for the requests a client may make, drawn by
Hypothesis: every field vLLM writes, the ones the judge reads and the ones it does not
(``vllm_wire``'s events, with the options that add to them: ``n``, ``logprobs`` and
``top_logprobs``, ``return_token_ids``, ``echo``, continuous usage, tool calls,
reasoning; Responses' output items and their logprobs), ended every way a stream ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from slopilot.engine.meter.stream_judge import Wire
from tests.engine.meter import vllm_wire as wire

Stream = tuple[Wire, int, list[bytes]]
"""A stream's wire, its choices (``n``) and its events."""

tokens = st.lists(st.sampled_from([" a", "b", "\u00e9", "\n", '"', "\U0001f600"]),
                  min_size=1, max_size=3)
ends = st.sampled_from(["finish", "error", "cut"])
"""A stream ends by its finish reasons, or in vLLM's error event, or broken off."""


def edited(event: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """One SSE event (its ``event:`` name kept) with its data changed."""
    head, _, data = event.rstrip(b"\n").rpartition(b"data: ")
    payload = json.loads(data)
    change(payload)
    return head + b"data: " + json.dumps(payload, separators=(",", ":"),
                                         ensure_ascii=False).encode() + b"\n\n"


def _set_choice(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(chunk: dict[str, Any]) -> None:
        chunk["choices"][0].update(fields)
    return change


def _top(token: str, top: int) -> list[dict[str, Any]]:
    return [{"token": f"{token}{j}", "logprob": -2.5, "bytes": list(f"{token}{j}".encode())}
            for j in range(top)]


def chat_logprobs(toks: list[str], top: int) -> dict[str, Any]:
    """``ChatCompletionLogProbs``: one entry a token, its ``top_logprobs``."""
    return {"content": [{"token": t, "logprob": -0.5, "bytes": list(t.encode()),
                         "top_logprobs": _top(t, top)} for t in toks]}


def completion_logprobs(toks: list[str], offset: int, top: int,
                        first_none: bool = False) -> dict[str, Any]:
    """``CompletionLogProbs``: parallel lists, one entry a token (an echoed prompt's
    first token has none)."""
    entries = [{t: -0.5, f"{t}x": -2.5} if top else None for t in toks]
    return {"text_offset": list(range(offset, offset + len(toks))),
            "token_logprobs": [None if first_none and i == 0 else -0.5
                               for i in range(len(toks))],
            "tokens": toks, "top_logprobs": None if not top else
            [None if first_none and i == 0 else e for i, e in enumerate(entries)]}


def _tool_call(first: bool, arguments: str) -> list[dict[str, Any]]:
    if first:
        return [{"id": "chatcmpl-tool-7", "type": "function", "index": 0,
                 "function": {"name": "get_weather", "arguments": arguments}}]
    return [{"index": 0, "function": {"arguments": arguments}}]


@st.composite
def chat_streams(draw: st.DrawFn) -> Stream:
    n = draw(st.integers(1, 2), label="n")
    usage = draw(st.sampled_from(["none", "last", "continuous"]), label="usage")
    top = draw(st.sampled_from([None, 0, 2]), label="top_logprobs")
    ids = draw(st.booleans(), label="return_token_ids")
    so_far = [0] * n

    def u(i: int) -> tuple[int, int] | None:
        return (5, so_far[i]) if usage == "continuous" else None

    def chunk(i: int, toks: list[str], finish: str | None = None, **delta: Any) -> bytes:
        event = wire.chat_delta(i, finish=finish, usage=u(i), logprobs=None if top is None
                                else chat_logprobs(toks, top), **delta)
        return edited(event, _set_choice(token_ids=[7] * len(toks))) if ids and toks \
            else event

    events = [wire.chat_role(i, usage=u(i)) for i in range(n)]
    if draw(st.booleans(), label="echo"):
        events += [wire.chat_echo("Hello", i, usage=u(i)) for i in range(n)]
    called = [False] * n
    for _ in range(draw(st.integers(0, 5), label="chunks")):
        i = draw(st.integers(0, n - 1))
        toks = draw(tokens)
        so_far[i] += len(toks)
        field = draw(st.sampled_from(["content", "reasoning_content", "reasoning",
                                      "tool_calls", "function_call"]))
        text = "".join(toks)
        value: Any = text
        if field == "tool_calls":
            value, called[i] = _tool_call(not called[i], text), True
        elif field == "function_call":
            value = {"name": "get_weather", "arguments": text}
        events.append(chunk(i, toks, **{field: value}))
    end = draw(ends, label="end")
    if end == "finish":
        for i in range(n):
            toks = draw(st.just([]) | tokens)  # the last output, or none left
            so_far[i] += len(toks)
            finish = draw(st.sampled_from(["stop", "length", "tool_calls"]))
            events.append(chunk(i, toks, finish, **({"content": "".join(toks)} if toks
                                                     else {})))
        if usage != "none":
            events.append(wire.chat_usage(5, sum(so_far)))
    elif end == "error":
        events.append(wire.error("EngineCore encountered an issue."))
    return Wire.CHOICES, n, events + ([] if end == "cut" else [wire.DONE])


@st.composite
def completion_streams(draw: st.DrawFn) -> Stream:
    n = draw(st.integers(1, 2), label="n")
    usage = draw(st.sampled_from(["none", "last", "continuous"]), label="usage")
    top = draw(st.sampled_from([None, 0, 2]), label="logprobs")
    ids = draw(st.booleans(), label="return_token_ids")
    echo = draw(st.booleans(), label="echo")
    so_far, offsets, events = [0] * n, [0] * n, []

    def chunk(i: int, toks: list[str], finish: str | None = None) -> bytes:
        prompt = [" Hello", " there"] if echo and not so_far[i] else []
        so_far[i] += len(toks)
        logprobs = None if top is None else completion_logprobs(
            prompt + toks, offsets[i], top, first_none=bool(prompt))
        offsets[i] += len(prompt) + len(toks)
        event = wire.completion(i, "".join(prompt + toks), finish=finish, logprobs=logprobs,
                                usage=(5, so_far[i]) if usage == "continuous" else None)
        if ids:
            event = edited(event, _set_choice(
                token_ids=[7] * len(toks), prompt_token_ids=[1, 2] if prompt else None))
        return event

    for _ in range(draw(st.integers(1, 5), label="chunks")):
        events.append(chunk(draw(st.integers(0, n - 1)), draw(tokens)))
    end = draw(ends, label="end")
    if end == "finish":
        for i in range(n):
            events.append(chunk(i, draw(tokens), draw(st.sampled_from(["stop", "length"]))))
        if usage != "none":
            events.append(wire.completion_usage(5, sum(so_far)))
    elif end == "error":
        events.append(wire.error("Request aborted."))
    return Wire.CHOICES, n, events + ([] if end == "cut" else [wire.DONE])


def _output_items(kind: str, text: str, logprobs: list[Any]) -> list[dict[str, Any]]:
    """The answer's ``output``, as ``response.completed`` writes it whole."""
    if kind == "function_call":
        return [{"arguments": text, "call_id": "call_7", "name": "get_weather",
                 "type": "function_call", "id": "fc_7", "status": "completed"}]
    if kind == "reasoning":
        return [{"id": "rs_7", "summary": [], "type": "reasoning", "content": [
            {"text": text, "type": "reasoning_text"}], "encrypted_content": None,
            "status": "completed"}]
    return [{"id": "msg_7", "content": [{"annotations": [], "text": text,
                                         "type": "output_text", "logprobs": logprobs}],
             "role": "assistant", "status": "completed", "type": "message"}]


@st.composite
def responses_streams(draw: st.DrawFn) -> Stream:
    s = wire.ResponsesStream(max_output_tokens=8)
    kind = draw(st.sampled_from(["message", "reasoning", "function_call"]), label="output")
    top = draw(st.sampled_from([None, 0, 2]), label="top_logprobs")
    events, text, entries = [s.created()], "", []
    if kind != "function_call":
        events.append(s.message_added(reasoning=kind == "reasoning"))
    for i in range(draw(st.integers(0, 4), label="deltas")):
        toks = draw(tokens)
        text += "".join(toks)
        if kind == "function_call":
            events.append(s.function_call_added("get_weather") if i == 0
                          else s.arguments("".join(toks)))
        elif kind == "reasoning":
            events.append(s.reasoning("".join(toks)))
        else:
            lps = [] if top is None else [{"token": t, "logprob": -0.5, "bytes": list(
                t.encode()), "top_logprobs": _top(t, top)} for t in toks]
            entries += lps
            events.append(s.text("".join(toks), logprobs=lps))
    if kind == "message":
        events.append(s.text_done(text))
    end = draw(st.sampled_from(["completed", "incomplete-status", "incomplete", "failed",
                                "error", "cut"]), label="end")
    output = _output_items(kind, text, entries)

    def with_output(event: dict[str, Any]) -> None:
        event["response"]["output"] = output

    if end in ("completed", "incomplete-status"):
        status = "completed" if end == "completed" else "incomplete"
        events.append(edited(s.completed(len(entries) or 3, status=status), with_output))
    elif end == "incomplete":
        reason = draw(st.sampled_from(["max_output_tokens", "content_filter", "other"]))
        events.append(edited(s.incomplete(len(entries) or 3, reason), with_output))
    elif end == "failed":
        events.append(s.failed())
    elif end == "error":
        events.append(s.error("EngineCore encountered an issue."))
    return Wire.RESPONSES, 1, events


streams = st.one_of(chat_streams(), completion_streams(), responses_streams())
