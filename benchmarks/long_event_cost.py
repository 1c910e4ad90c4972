"""What the meter spends reading a long SSE event, beside what the client spends parsing
the same event.

Such an event (a Responses ``response.completed`` with its logprobs, a completions
``echo`` chunk with a long prompt's logprobs) is read on the event loop that relays every
stream: each read's cost is a stall of the other streams' tokens. Past
``MAX_EVENT_BYTES`` it is read as it passes (``meter/long_event``, by its JSON's
structure: ``meter/json_paths``); below them it is held, and parsed when it ends
(``--mib`` under 1 measures that: the ``held`` column says which). The peer is the
client's own parser: ``json.loads`` of the event's data, which the client runs whole on
the same bytes. Per case, the median over ``--runs`` of the meter's read (the whole
stream through ``StreamJudge.written`` in ``--read-kib`` pieces, as the proxy hands it
over) and of ``json.loads`` on the event's data; their ratio; the longest single read
(all its steps: ``StreamJudge.read_steps``) and the longest step (the stall one step
makes: the proxy lets the loop run between two); and the meter's peak memory while
reading (tracemalloc, one run apart, as it slows the read). A tree before
``read_steps`` reads each piece in one step.

Cases, in vLLM's field order (``tests/engine/meter/vllm_wire.py`` describes it; written
out here, benchmarks import no test support):

- ``responses``: ``response.completed`` of an answer with ``--mib`` MiB of output-text
  logprobs (``include: ["message.output_text.logprobs"]``);
- ``echo``: a completions chunk echoing a prompt with its ``top_logprobs`` (token ->
  logprob maps: the client's text as keys);
- ``schema``: a ``response.completed`` whose echoed tool schema nests 800 levels deep
  (what a client may send; Python's own parser stops near 1,000), walked bracket by
  bracket below the paths read;
- ``tools``: a ``response.completed`` echoing a client's tools, ``--mib`` MiB of them
  (0.9 at most: held), each a JSON Schema of objects nested 8 deep, deeper than one part
  of ``meter/json_steps``' pattern takes at 5 levels (then walked container by
  container; parsed in runs since it takes 32), and one 100 deep;
- ``deep``: the same, each schema nested 80 deep (``json_steps`` hops through them);
- ``deeper``: the same, each schema nested 300 deep and described at each level, 12 KiB:
  longer than a part and deeper than its pattern (``json_steps`` parses its levels in
  shells, ``json_shells``; it walked them level by level before);
- ``chunks``: a stream of ordinary completions chunks, one token each (``--mib``, 1 at
  most): its longest step is what one read of them costs, the reference for the others'.

    .venv/bin/python benchmarks/long_event_cost.py [--mib 16] [--runs 5] [--read-kib 64]

Ends with ``RESULT`` ``CASE_ms_per_mib``, ``CASE_json_loads_ms_per_mib``,
``CASE_ratio``, ``CASE_max_read_ms``, ``CASE_max_step_ms`` and ``CASE_peak_kib`` for each
case.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any, cast

from slopilot.engine.meter.stream_judge import MAX_EVENT_BYTES, StreamJudge, Verdict, Wire
from slopilot.engine.slo import ClassSLO

SLO = ClassSLO(ttft_p99_ms=60_000, tbt_p99_ms=60_000)
MIB = 1 << 20


def _compact(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _named(kind: str, seq: int, **fields: Any) -> bytes:
    payload = {**fields, "sequence_number": seq, "type": kind}
    return b"event: " + kind.encode() + b"\ndata: " + _compact(payload) + b"\n\n"


def _response(status: str, output: list[Any], tools: list[Any], tokens: int) -> dict[str, Any]:
    return {
        "id": "resp_7", "created_at": 1, "incomplete_details": None, "instructions": None,
        "metadata": None, "model": "llama", "object": "response", "output": output,
        "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
        "tools": tools, "top_p": 1.0, "background": False, "max_output_tokens": None,
        "max_tool_calls": None, "previous_response_id": None, "prompt": None,
        "reasoning": None, "service_tier": "auto", "status": status, "text": None,
        "top_logprobs": None, "truncation": "disabled",
        "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 5 + tokens},
        "user": None}


def _logprob(i: int) -> dict[str, Any]:
    return {"token": f" w{i}", "logprob": -1.25, "bytes": [32, 119],
            "top_logprobs": [{"token": f" v{i}", "logprob": -2.5, "bytes": [32, 118]}]}


def _schema(depth: int, described: bool = False) -> dict[str, Any]:
    nested: dict[str, Any] = {"type": "string"}
    for i in range(depth):
        nested = {"type": "object", "properties": {"x": nested}}
        if described:
            nested = {"type": "object", "description": f"Level {i}.", **nested,
                      "required": ["x"]}
    return nested


def _tool(depth: int, described: bool = False) -> dict[str, Any]:
    return {"type": "function", "name": "f", "parameters": _schema(depth, described),
            "strict": False, "description": None}


def tools_stream(mib: float, depth: int = 4,
                 described: bool = False) -> tuple[list[bytes], bytes]:
    """A Responses stream whose last event echoes ``mib`` MiB of tools, each nested
    2 x ``depth`` deep (their schemas: ``depth`` objects, each in its ``properties``,
    with a description and ``required`` where ``described``), and one 100 deep."""
    tool = _tool(depth, described)
    count = max(1, int(mib * MIB / len(_compact(tool))))
    return responses_stream(0.0, tools=[_tool(100), *[tool] * count])


def responses_stream(mib: float, *, depth: int = 0,
                     tools: list[Any] | None = None) -> tuple[list[bytes], bytes]:
    """A Responses stream whose last event holds ``mib`` MiB of logprobs (and, with
    ``depth``, a tool schema nested that deep; or ``tools``); the stream's events and
    that event's data."""
    entries = max(1, int(mib * MIB / len(_compact(_logprob(10_000)))))
    text = "ab" * 3
    output = [{"type": "message", "id": "msg_7", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": [],
                            "logprobs": [_logprob(i) for i in range(entries)]}]}]
    if tools is None:
        tools = [_tool(depth)] if depth else []
    head = [
        _named("response.created", 0, response=_response("in_progress", [], tools, 0)),
        _named("response.output_item.added", 1, item=output[0] | {"content": []},
               output_index=0),
        _named("response.output_text.delta", 2, content_index=0, delta="ab", item_id="msg_7",
               logprobs=[], output_index=0),
        _named("response.output_text.delta", 3, content_index=0, delta="abab",
               item_id="msg_7", logprobs=[], output_index=0),
    ]
    last = _named("response.completed", 4, response=_response("completed", output, tools, 3))
    return [*head, last], last.split(b"data: ", 1)[1].rstrip(b"\n")


def echo_stream(mib: float) -> tuple[list[bytes], bytes]:
    """A completions stream whose first chunk echoes a prompt with ``mib`` MiB of its
    ``top_logprobs`` (token text as keys); the stream's events and that chunk's data."""
    per = len(_compact({"t": {" w10000": -1.25}})) + 20
    entries = max(1, int(mib * MIB / per))
    logprobs = {"text_offset": list(range(entries)),
                "token_logprobs": [-1.25] * entries,
                "tokens": [f" w{i}" for i in range(entries)],
                "top_logprobs": [{f" w{i}": -1.25} for i in range(entries)]}

    def chunk(text: str, lp: Any, finish: str | None, usage: Any) -> bytes:
        return b"data: " + _compact({
            "id": "cmpl-7", "object": "text_completion", "created": 1, "model": "llama",
            "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None}],
            "usage": usage}) + b"\n\n"

    first = chunk("prompt text", logprobs, None,
                  {"prompt_tokens": entries, "completion_tokens": 1,
                   "total_tokens": entries + 1, "prompt_tokens_details": None})
    rest = [chunk("a", None, None, {"prompt_tokens": entries, "completion_tokens": 2,
                                     "total_tokens": entries + 2,
                                     "prompt_tokens_details": None}),
            chunk("b", None, "length", {"prompt_tokens": entries, "completion_tokens": 3,
                                        "total_tokens": entries + 3,
                                        "prompt_tokens_details": None}),
            b"data: [DONE]\n\n"]
    return [first, *rest], first.split(b"data: ", 1)[1].rstrip(b"\n")


def chunks_stream(mib: float) -> tuple[list[bytes], list[bytes]]:
    """``mib`` MiB of a completions stream's chunks, one token each with its continuous
    usage; the stream's events and their data."""
    events: list[bytes] = []
    size = 0
    while size < mib * MIB:
        n = len(events) + 1
        events.append(b"data: " + _compact({
            "id": "cmpl-7", "object": "text_completion", "created": 1, "model": "llama",
            "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None}],
            "usage": {"prompt_tokens": 5, "total_tokens": 5 + n, "completion_tokens": n,
                      "prompt_tokens_details": None}}) + b"\n\n")
        size += len(events[-1])
    events[-1] = events[-1].replace(b'"finish_reason":null', b'"finish_reason":"length"')
    return [*events, b"data: [DONE]\n\n"], [e[6:].rstrip(b"\n") for e in events]


def read(pieces: list[bytes], wire: Wire) -> tuple[list[Verdict], float, float]:
    """The stream's reads through a judge, each in the steps the proxy runs it in: its
    verdicts, the longest read and the longest step in seconds."""
    judge = StreamJudge(SLO, 0.0, wire=wire)
    longest_read = longest_step = 0.0
    for at, data in enumerate(pieces):
        t0 = step = time.perf_counter()
        for _ in _steps(judge, data, 0.01 * (at + 1)):
            now = time.perf_counter()
            longest_step, step = max(longest_step, now - step), now
        now = time.perf_counter()
        longest_step = max(longest_step, now - step)
        longest_read = max(longest_read, now - t0)
    return judge.verdicts(1e6), longest_read, longest_step


def _steps(judge: StreamJudge, data: bytes, at: float) -> Iterator[None]:
    steps = getattr(judge, "read_steps", None)
    if steps is None:  # a tree before it: the piece read in one step
        judge.written(data, at)
        return iter(())
    return cast(Iterator[None], steps(data, at))


def _loads(payloads: list[bytes]) -> None:
    for data in payloads:
        json.loads(data)


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=16.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--read-kib", type=int, default=64)
    args = parser.parse_args()
    piece = args.read_kib * 1024
    cases = {
        name: (events, [data], wire, 3) for name, (events, data), wire in [
            ("responses", responses_stream(args.mib), Wire.RESPONSES),
            ("echo", echo_stream(args.mib), Wire.CHOICES),
            ("schema", responses_stream(max(2.0, args.mib / 8), depth=400), Wire.RESPONSES),
            ("tools", tools_stream(min(0.9, args.mib)), Wire.RESPONSES),
            ("deep", tools_stream(min(0.9, args.mib), depth=40), Wire.RESPONSES),
            ("deeper", tools_stream(min(0.9, args.mib), depth=150, described=True),
             Wire.RESPONSES)]}
    events, payloads = chunks_stream(min(1.0, args.mib))
    cases["chunks"] = (events, payloads, Wire.CHOICES, len(payloads))
    result: dict[str, str] = {}
    print(f"{'case':10s} {'MiB':>6s} {'held':>5s} {'meter ms/MiB':>13s} {'json.loads ms/MiB':>18s} "
          f"{'ratio':>6s} {'longest read ms':>16s} {'longest step ms':>16s} "
          f"{'peak KiB':>9s}")
    for name, (events, payloads, wire, tokens) in cases.items():
        held = max(map(len, payloads)) <= MAX_EVENT_BYTES
        stream = b"".join(events)
        pieces = [stream[i:i + piece] for i in range(0, len(stream), piece)]
        verdicts, _, _ = read(pieces, wire)
        # The read must be right before its cost counts: one verdict, every token.
        assert verdicts == [Verdict(True, tokens)], (name, verdicts)
        mib = len(stream) / MIB
        meter_s = median_s(functools.partial(read, pieces, wire), args.runs)
        longests = [read(pieces, wire)[1:] for _ in range(args.runs)]
        longest = statistics.median(r for r, _ in longests)
        longest_step = statistics.median(s for _, s in longests)
        loads_s = median_s(functools.partial(_loads, payloads), args.runs)
        # The reads are the caller's bytes: the peak is what the judge holds beside them.
        tracemalloc.start()
        read(pieces, wire)
        peak_kib = tracemalloc.get_traced_memory()[1] / 1024
        tracemalloc.stop()
        print(f"{name:10s} {mib:6.2f} {'yes' if held else 'no':>5s} {meter_s * 1000 / mib:13.1f} "
              f"{loads_s * 1000 / mib:18.1f} {meter_s / loads_s:6.2f} "
              f"{longest * 1000:16.2f} {longest_step * 1000:16.2f} {peak_kib:9.0f}")
        result |= {f"{name}_ms_per_mib": f"{meter_s * 1000 / mib:.1f}",
                   f"{name}_json_loads_ms_per_mib": f"{loads_s * 1000 / mib:.1f}",
                   f"{name}_ratio": f"{meter_s / loads_s:.2f}",
                   f"{name}_max_read_ms": f"{longest * 1000:.2f}",
                   f"{name}_max_step_ms": f"{longest_step * 1000:.2f}",
                   f"{name}_peak_kib": f"{peak_kib:.0f}"}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
