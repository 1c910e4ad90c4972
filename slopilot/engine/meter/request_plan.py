"""A request read as vLLM reads it, to plan how the meter forwards and judges it.

- A streamed completion (``POST /v1/completions``, ``/v1/chat/completions`` or
  ``/v1/responses`` with ``"stream": true``) is judged against the objectives of its
  class (``--priority-class``) as they stood at its arrival, for as many choices and
  tokens as vLLM will write for it. A non-streamed body shows its client no first
  token, and is not judged; nor is a Responses answer streamed again by GET
  (``is_replay``), counted apart instead.
- A chat or completions stream asks vLLM for each chunk's token count (continuous usage:
  ``usage_stats``), and the client gets its answer without the usage it did not ask for,
  the bytes vLLM would have written for its own request. The engine gets the client's
  bytes but for the ``stream_options`` member, written where it was (its last, the one
  vLLM's ``json.loads`` keeps), else at the object's end. Not a completions request
  vLLM does not stream (beam search, a ``best_of`` other than ``n``: one event of the
  whole response, its usage always filled), which goes as it came, and so comes back.
- A body is read for the few top-level fields the plan needs, and its prompts counted,
  in steps of 64 KiB that let the loop run between two (``request_fields``): none of its
  prompts is made into Python's values. Parsed whole (on a thread, holding the GIL all
  the same), an 8 MiB body of one-token prompts took 300 MB, past the meter's memory
  limit, and stalled every stream beside it 1.3 s.
- Any request for generation to those paths, streamed or not, is counted as the requests
  vLLM serves it as (``Plan.arrivals``): the workload probe's arrivals on vLLM, where a
  request whose client gave up is in none of vLLM's series. Its first prompt's choices
  are counted as it is forwarded, a batch's other prompts' once the engine answered
  (``Plan.at_once``): only then is the batch known to have reached it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Generator
from typing import Any, TypeVar

import pydantic

from slopilot.engine.meter import request_fields, usage_stats
from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.meter.stream_judge import StreamJudge, Wire
from slopilot.engine.request import Priority

RESPONSES_PATH = "/v1/responses"
"""The Responses API's: vLLM v0.11 serves it (``api_server.create_responses``), one
answer a request (no ``n``), limited by ``max_output_tokens``."""
JUDGED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", RESPONSES_PATH})
COMPLETIONS_MAX_TOKENS = 16
"""vLLM's ``max_tokens`` for a completions request that leaves it out (v0.11,
``protocol.CompletionRequest``; the chat API's is the context)."""
READS = frozenset({"stream", "n", "stream_options", "max_tokens", "max_completion_tokens",
                   "max_output_tokens", "use_beam_search", "best_of"})
"""The top-level fields of a request the plan reads (``_choices``, ``judge``,
``usage_stats.asked``), besides its prompts' count."""

Buffer = bytes | bytearray | memoryview


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a request is forwarded: its judge (None: not judged), the body the engine is
    sent (its pieces, in order: the client's bytes, but for the stream options the
    meter asks for), and what of the answer's usage the client gets (None: all of it)."""

    judge: StreamJudge | None
    body: tuple[Buffer, ...]
    strip: usage_stats.UsageStrip | None = None
    arrivals: int = 0
    """The requests vLLM serves it as, each in its series as one (each prompt of a
    completions batch: vLLM runs each of a list of texts or of token lists as a request of
    its own, streamed as choices ``prompt_idx * n + i``; each of its ``n`` choices:
    ``_choices``); 0 for what asks for no generation."""
    at_once: int = 0
    """Of ``arrivals``, those counted as the request is forwarded, and judged where its
    stream is cut short before the engine's status: its first prompt's choices (its
    ``n``). The rest, a batch's other prompts', once the engine
    answered: vLLM counts a batch in its series once it took it, and a client that
    left before any status (or an engine that broke off first) proved no such thing,
    while a body of 80 KB (20,000 prompts, ``n`` 128) counted 2,560,001 arrivals at once
    that nothing took back."""


class RequestPlanner:
    """Plans the requests of one meter: judged by ``slo``'s objectives for ``priority``,
    each judged stream's first tokens and gaps observed in ``latency``."""

    def __init__(self, slo: SLOWatch, priority: Priority, latency: ClientLatency) -> None:
        self.slo, self.priority, self.latency = slo, priority, latency

    async def plan(self, method: str, path: str, body: bytes | bytearray,
                   arrival: float) -> Plan:
        """How to forward a request to ``path`` (as the engine is asked for it): a
        streamed completion is judged, and a chat or completions one asks the engine for
        each chunk's token count (``usage_stats``); anything else goes as it came."""
        if method != "POST" or path not in JUDGED_PATHS:
            return Plan(None, (body,))
        completions = path == "/v1/completions"
        fields = await _stepped(request_fields.scan(
            body, READS, count="prompt" if completions else None))
        if fields is None:
            return Plan(None, (body,))  # vLLM answers it 400: no request of its model
        data = fields.values
        choices = _choices(path, data)
        arrivals = choices * (fields.counted or 1)
        if _lax(_BOOL, data.get("stream")) is not True:
            return Plan(None, (body,), arrivals=arrivals, at_once=choices)
        judge = self.judge(path, data, arrival)
        usage = usage_stats.asked(data)
        if path == RESPONSES_PATH or usage is None or usage is usage_stats.Asked.CONTINUOUS \
                or (completions and _answered_whole(data)):
            return Plan(judge, (body,), arrivals=arrivals, at_once=choices)
        # ASCII-escaped: a string Python's reader took with a lone surrogate in it has
        # no UTF-8, and reaches vLLM as the same string.
        try:
            member = b'"stream_options": ' + \
                json.dumps(usage_stats.ask(data)["stream_options"]).encode()
        except (ValueError, RecursionError):
            # Nested past what Python writes back: as it came.
            return Plan(judge, (body,), arrivals=arrivals, at_once=choices)
        view = memoryview(body)
        start, end = fields.spans.get("stream_options", (fields.end, fields.end))
        if start == end:  # none given: the object's last member (it has ``stream``)
            member = b"," + member
        return Plan(judge, (view[:start], member, view[end:]), usage_stats.UsageStrip(
            usage, null_usage=completions), arrivals=arrivals, at_once=choices)

    def judge(self, path: str, data: dict[str, Any], arrival: float) -> StreamJudge:
        """The judge of a streamed completion to ``path`` asked for with ``data``, for
        its first prompt's choices (``Plan.at_once``; the proxy raises them to all of a
        batch's once the engine answered)."""
        slo = self.slo.current().class_slo(self.priority)
        if path == RESPONSES_PATH:
            # vLLM's ResponsesRequest: null or left out, the context's limit, as chat's.
            limit = _lax(_INT, data.get("max_output_tokens"))
            return StreamJudge(slo, arrival, max_tokens=limit if limit is not None and
                               limit > 0 else None, latency=self.latency,
                               wire=Wire.RESPONSES)
        completions = path == "/v1/completions"
        # vLLM's rule: the chat API's newer spelling first, where it is given. Its
        # completions API has a default of its own where the field is left out (null:
        # the context, as for chat).
        max_tokens = _lax(_INT, data.get("max_completion_tokens")) or \
            _lax(_INT, data.get("max_tokens", COMPLETIONS_MAX_TOKENS if completions else None))
        return StreamJudge(slo, arrival, choices=_choices(path, data),
                           max_tokens=max_tokens if max_tokens is not None and
                           max_tokens > 0 else None, latency=self.latency)


def is_replay(method: str, path: str) -> bool:
    """Whether a request answered with an event stream streams a stored response again:
    ``GET /v1/responses/{id}`` with ``stream`` (vLLM replays the events it had generated
    for it, from ``starting_after`` on, then those it generates next).

    Not judged: its arrival is not the request's that the answer was generated for, its
    first events come from a buffer at once, and its tokens were the first stream's,
    which was judged (or cut short) as its client saw it. Judged, it would count the
    same answer twice, with a first token read in microseconds."""
    return method == "GET" and path.startswith(RESPONSES_PATH + "/") and \
        "/" not in path[len(RESPONSES_PATH) + 1:] and len(path) > len(RESPONSES_PATH) + 1


def _choices(path: str, data: dict[str, Any]) -> int:
    """The choices vLLM streams for each prompt of a chat or completions request: its
    ``n``, however many (v0.11: ``sampling_params.py:377-378`` refuses only one below 1,
    a 400 read here as one choice, which the invalid count takes off;
    ``v1/engine/async_llm.py:292-300`` runs each choice as a child request of its own,
    counted in its series as one). Cheap to judge however many: the choices that never
    came are one verdict of their count. A Responses request is one answer."""
    if path == RESPONSES_PATH:
        return 1
    n = _lax(_INT, data.get("n", 1))
    return n if n is not None and n >= 1 else 1


def _answered_whole(data: dict[str, Any]) -> bool:
    """Whether vLLM answers a completions request asking for a stream with the whole
    response as one event instead (v0.11, ``serving_completion.py:242-247``: with
    ``use_beam_search``, or a ``best_of`` given other than ``n``), its usage filled
    whatever ``stream_options`` say (300-308): nothing of it to ask for or take out."""
    if _lax(_BOOL, data.get("use_beam_search")) is True:
        return True
    best_of = _lax(_INT, data.get("best_of"))
    return best_of is not None and best_of != _lax(_INT, data.get("n", 1))


T = TypeVar("T")


async def _stepped(steps: Generator[None, None, T]) -> T:
    """``steps`` run to their value, the loop let run between two."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


# vLLM reads a request's fields with pydantic, in its lax mode: "stream": 1 or "true" is
# a stream, "n": "2" two choices. Read the same way, or a client could opt out of its
# verdicts by spelling a field as vLLM accepts and the meter did not.
_BOOL: pydantic.TypeAdapter[bool] = pydantic.TypeAdapter(bool)
_INT: pydantic.TypeAdapter[int] = pydantic.TypeAdapter(int)


def _lax(adapter: pydantic.TypeAdapter[Any], value: Any) -> Any:
    """``value`` as vLLM's request model reads it; None where it refuses it (vLLM then
    answers 400, and there is nothing to judge)."""
    if value is None:
        return None
    try:
        return adapter.validate_python(value)
    except pydantic.ValidationError:
        return None
