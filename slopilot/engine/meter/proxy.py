"""The meter's ASGI app: every request forwarded to vLLM, streams judged as written.

- Each request's body is read whole (at most ``max_body_bytes``: 413 past it), sent on
  to the upstream with the client's method, path, query and headers (hop-by-hop ones
  dropped), and the answer streamed back piece by piece as it comes.
- A streamed completion (``POST /v1/completions``, ``/v1/chat/completions`` or
  ``/v1/responses`` with ``"stream": true``) is read as it is written
  (``StreamJudge``), each piece stamped once the client's side took it (the send
  returned), and judged at its end against the objectives of its class
  (``--priority-class``) as they stood at its arrival. Its arrival is when its bytes
  came in, as the server's protocol stamped it (``http_arrival``), not when the app was
  called: for a request pipelined behind another on one connection, a whole answer
  later.
  A non-streamed body shows its client no first token, and is not judged; nor is a
  Responses answer streamed again by GET (``is_replay``), counted apart instead.
- A chat or completions stream asks vLLM for each chunk's token count (continuous usage:
  ``usage_stats``), and the client gets its answer without the usage it did not ask for,
  the bytes vLLM would have written for its own request.
- A client that goes away has the upstream request closed at once, so vLLM aborts it
  and frees its cache rather than generating for nobody.
- Each answer carries one ``date``: the engine's passes through (the server adds none,
  or there would be two), and the meter dates its own answers and any that came without.
- Each judged stream's first tokens and token gaps are observed as they are written
  (``ClientLatency``): the TTFT and TBT its client saw, which the rules read on a vLLM
  deployment where vLLM's own leave out its frontend's work.
- ``GET /metrics`` is vLLM's exposition (asked for in the text format, whose names keep
  their colons), then the verdict counters (``Verdicts.families``), then the client-side
  histograms: one answer, one ``instance``, so the goodput rule joins vLLM's tokens and
  the verdicts per replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import pydantic
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from slopilot.engine.http_arrival import SCOPE_KEY
from slopilot.engine.meter import usage_stats
from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.meter.stream_judge import StreamJudge, Wire
from slopilot.engine.metrics_text import TextRegistry, parts_text, render
from slopilot.engine.request import Priority

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

RESPONSES_PATH = "/v1/responses"
"""The Responses API's: vLLM v0.11 serves it (``api_server.create_responses``), one
answer a request (no ``n``), limited by ``max_output_tokens``."""
JUDGED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", RESPONSES_PATH})
REPLAYED_STREAMS = "slopilot_meter_replayed_streams"
"""Responses streamed again by GET (``is_replay``), counted, not judged (base name)."""
MAX_BODY_BYTES = 64 << 20
"""A request body larger than this is refused (413): a prompt of 64 MiB is past any
context, and the meter holds a body whole before it forwards it."""
MAX_CHOICES = 128
"""The most choices (``n``) a cut-short stream is judged for: vLLM refuses more."""
VLLM_KEEP_ALIVE_S = 5.0
"""How long vLLM's server keeps an idle connection (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, its
uvicorn's ``timeout_keep_alive``; 5 s by default)."""
UPSTREAM_IDLE_S = 2.0
"""How long the meter keeps an idle connection to vLLM for reuse: well under vLLM's own.
httpx's default is 5 s, vLLM's too, so a request sent on a connection vLLM was closing
that instant failed (a 502 to a client vLLM would have served)."""
COMPLETIONS_MAX_TOKENS = 16
"""vLLM's ``max_tokens`` for a completions request that leaves it out (v0.11,
``protocol.CompletionRequest``; the chat API's is the context)."""
INLINE_PARSE_BYTES = 64 << 10
"""Request bodies up to this size are parsed on the event loop (well under a millisecond);
larger ones on a thread."""
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
# RFC 9110 7.6.1, and what a proxy must not pass on; host and length are the new hop's.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "te", "trailer", "transfer-encoding",
                         "upgrade", "host", "content-length"})


@dataclasses.dataclass
class _Exchange:
    """One request's judge (None: not a stream the meter judges), counted once."""

    judge: StreamJudge | None = None
    counted: bool = False


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How a request is forwarded: its judge (None: not judged), the body the engine is
    sent, and what of the answer's usage the client gets (None: all of it)."""

    judge: StreamJudge | None
    body: bytes
    strip: usage_stats.UsageStrip | None = None


class _ClientGone(Exception):
    """The client went away before its request was whole."""


class _VerdictCollector(Collector):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def collect(self) -> Any:
        return self.meter.verdicts.families(self.meter.model_name)


class _LatencyCollector(Collector):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def collect(self) -> Any:
        return self.meter.latency.families(self.meter.model_name)

    def exposition(self) -> str:
        """Its text on a scrape (``metrics_text.TextCollector``)."""
        return parts_text(self.meter.latency.texts(self.meter.model_name))


class _ReplayCollector(Collector):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def collect(self) -> Any:
        family = CounterMetricFamily(
            REPLAYED_STREAMS, "Responses re-streamed by GET /v1/responses/{id}?stream=true "
            "(a stored answer's events again): passed on, not judged.",
            labels=["priority_class"])
        family.add_metric([self.meter.priority.label], self.meter.replays)
        yield family


class Meter:
    """The ASGI app. ``clock``: when a piece was written, and when a request arrived where
    its server stamped none (monotonic seconds; the server's protocol stamps on this
    clock too, ``commands.uvicorn_config``)."""

    def __init__(self, upstream: str, slo: SLOWatch, priority: Priority, *,
                 client: httpx.AsyncClient | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.upstream = upstream.rstrip("/")
        self.upstream_url = httpx.URL(self.upstream)
        self.slo, self.priority, self.clock = slo, priority, clock
        self.verdicts = slo.verdicts
        self.latency = ClientLatency(priority)
        """Each judged stream's first tokens and gaps, observed as written."""
        self.max_body_bytes = max_body_bytes
        self.model_name = ""
        """The served model's name, as the judged streams name it."""
        # No read timeout: a long generation sends nothing for minutes, and the client
        # going away closes it (``_watch_disconnect``). No cap on connections: httpx's
        # default pool (100) queued the 101st stream inside the meter, out of reach of
        # vLLM's max_num_seqs (the tuner draws up to 1,024), its priority queue and its
        # metrics; vLLM queues what it cannot run itself.
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0), follow_redirects=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None,
                                keepalive_expiry=UPSTREAM_IDLE_S))
        self.registry = TextRegistry()
        self.registry.register(_VerdictCollector(self))
        self.registry.register(_LatencyCollector(self))
        self.registry.register(_ReplayCollector(self))  # scraped in this order
        self.replays = 0
        """Responses streamed again (``is_replay``), passed on unjudged."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: vLLM's OpenAI API has none
        stamp = scope.get(SCOPE_KEY)
        arrival = float(stamp) if stamp is not None else self.clock()
        try:
            body = await self._body(receive)
        except _ClientGone:
            return  # gone before its request was whole: nothing to forward to anyone
        if body is None:
            await _answer(send, 413, {"error": {
                "message": f"request body over the meter's {self.max_body_bytes} bytes",
                "type": "invalid_request_error", "code": "request_too_large"}})
            return
        exchange = _Exchange()
        forward = asyncio.ensure_future(self._forward(scope, body, send, arrival, exchange))
        watch = asyncio.ensure_future(_watch_disconnect(receive))
        try:
            await asyncio.wait({forward, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (forward, watch):
                task.cancel()
            await asyncio.gather(forward, watch, return_exceptions=True)
            # The client left, or the engine's answer broke off: judged as cut short.
            self._count(exchange)
        if forward.done() and not forward.cancelled() and (exc := forward.exception()):
            raise exc

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _body(self, receive: Receive) -> bytes | None:
        """The request's body; None past ``max_body_bytes``."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)

    async def _plan(self, method: str, path: str, body: bytes, arrival: float) -> _Plan:
        """How to forward a request to ``path`` (as the engine is asked for it): a
        streamed completion is judged, and a chat or completions one asks the engine for
        each chunk's token count (``usage_stats``); anything else goes as it came."""
        if method != "POST" or path not in JUDGED_PATHS:
            return _Plan(None, body)
        try:
            # A long prompt's body parsed on the loop would hold every stream's next chunk
            # (and stretch the gaps the meter judges) for as long as it takes.
            data = json.loads(body) if len(body) <= INLINE_PARSE_BYTES else \
                await asyncio.to_thread(json.loads, body)
        except (ValueError, RecursionError):
            return _Plan(None, body)  # vLLM answers it 400
        if not isinstance(data, dict) or _lax(_BOOL, data.get("stream")) is not True:
            return _Plan(None, body)
        judge = self._judge(path, data, arrival)
        usage = usage_stats.asked(data)
        if path == RESPONSES_PATH or usage is None or usage is usage_stats.Asked.CONTINUOUS:
            return _Plan(judge, body)
        # ASCII-escaped: a string Python's reader took with a lone surrogate in it has
        # no UTF-8, and reaches vLLM as the same string.
        asking = usage_stats.ask(data)
        try:
            sent = json.dumps(asking).encode() if len(body) <= INLINE_PARSE_BYTES else \
                (await asyncio.to_thread(json.dumps, asking)).encode()
        except (ValueError, RecursionError):
            return _Plan(judge, body)  # nested past what Python writes back: as it came
        return _Plan(judge, sent, usage_stats.UsageStrip(
            usage, null_usage=path == "/v1/completions"))

    def _judge(self, path: str, data: dict[str, Any], arrival: float) -> StreamJudge:
        """The judge of a streamed completion to ``path`` asked for with ``data``."""
        slo = self.slo.current().class_slo(self.priority)
        if path == RESPONSES_PATH:
            # vLLM's ResponsesRequest: null or left out, the context's limit, as chat's.
            limit = _lax(_INT, data.get("max_output_tokens"))
            return StreamJudge(slo, arrival, max_tokens=limit if limit is not None and
                               limit > 0 else None, latency=self.latency,
                               wire=Wire.RESPONSES)
        n = _lax(_INT, data.get("n", 1))
        n = n if n is not None and 1 <= n <= MAX_CHOICES else 1
        completions = path == "/v1/completions"
        # vLLM's rule: the chat API's newer spelling first, where it is given. Its
        # completions API has a default of its own where the field is left out (null:
        # the context, as for chat).
        max_tokens = _lax(_INT, data.get("max_completion_tokens")) or \
            _lax(_INT, data.get("max_tokens", COMPLETIONS_MAX_TOKENS if completions else None))
        prompts = _prompts(data.get("prompt")) if completions else 1
        return StreamJudge(slo, arrival, choices=n * prompts,
                           max_tokens=max_tokens if max_tokens is not None and
                           max_tokens > 0 else None, latency=self.latency)

    async def _forward(self, scope: Scope, body: bytes, send: Send, arrival: float,
                       exchange: _Exchange) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if not raw_path.startswith(b"/"):
            # The target is the client's to write: glued to the upstream's URL,
            # "@host/..." named another host, reached from the pod with the client's
            # request. Only a path goes on, and into the path alone.
            await _answer(send, 400, {"error": {
                "message": "the request target must be a path, e.g. /v1/completions",
                "type": "invalid_request_error", "code": "invalid_request_target"}})
            return
        query: bytes = scope.get("query_string", b"")
        url = self.upstream_url.copy_with(raw_path=raw_path + (b"?" + query if query else b""))
        # Every decision reads the path the engine is asked for: httpx removes dot
        # segments, so "/v1/./completions" is served as /v1/completions, and read by the
        # client's spelling it was a stream that went unjudged.
        if scope["method"] == "GET" and url.path == "/metrics":
            await self._metrics(send)
            return
        plan = await self._plan(scope["method"], url.path, body, arrival)
        judge = exchange.judge = plan.judge
        strip = plan.strip
        headers = _request_headers(scope)
        if judge is not None:
            headers["accept-encoding"] = "identity"  # SSE read as written, not compressed
        request = self.client.build_request(scope["method"], url, headers=headers,
                                            content=plan.body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("%s %s: the engine did not answer: %s", scope["method"],
                        scope["path"], type(exc).__name__)
            await _answer(send, 502, {"error": {
                "message": f"the engine beside the meter did not answer: "
                           f"{type(exc).__name__}", "type": "server_error",
                "code": "upstream_unavailable"}})
            return
        try:
            kind = response.headers.get("content-type", "")
            if response.status_code != 200 or response.headers.get("content-encoding") \
                    or not kind.lower().startswith("text/event-stream"):
                # An error, bytes the meter cannot read as written, or no stream at all
                # (an image that ignores ``stream``): not judged, and passed on as is.
                judge = exchange.judge = None
                strip = None
            elif is_replay(scope["method"], url.path):
                self.replays += 1
            # Without the usage taken out, the engine's length is not the answer's.
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": _response_headers(response.headers,
                                                     keep_length=strip is None)})
            async for piece in response.aiter_raw():
                passed = piece if strip is None else strip.feed(piece)
                if passed:
                    await send({"type": "http.response.body", "body": passed,
                                "more_body": True})
                if judge is not None:
                    judge.written(piece, self.clock())
                    if judge.model is not None:
                        # From its first chunk on: the histograms it fed are labelled so.
                        self.model_name = judge.model
            if strip is not None and (rest := strip.flush()):
                await send({"type": "http.response.body", "body": rest, "more_body": True})
            # Counted before the end is sent: a response complete reads, to the server,
            # as a client gone (uvicorn), which cancels this task.
            self._count(exchange)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    def render(self) -> bytes:
        """The meter's own exposition: the verdicts, the client-side histograms and the
        replays, in that order. Byte for byte ``generate_latest(self.registry)``, its
        histograms written as their kept text (``metrics_text``): it runs on the loop
        that relays every stream's chunks, and holds them all while it runs."""
        return render(self.registry)

    def _count(self, exchange: _Exchange) -> None:
        """The stream's verdicts, once, as it ended now."""
        judge = exchange.judge
        if judge is None or exchange.counted:
            return
        exchange.counted = True
        for verdict in judge.verdicts(self.clock()):
            self.verdicts.observe(self.priority, judge.slo, met=verdict.met,
                                  tokens=verdict.tokens)

    async def _metrics(self, send: Send) -> None:
        """vLLM's exposition in the text format, then the verdicts' and the client-side
        histograms'. An upstream that does not answer fails the scrape (502): Prometheus
        then marks the replica down rather than reading verdicts without the tokens they
        are a share of."""
        try:
            response = await self.client.get(
                self.upstream + "/metrics", headers={"accept": TEXT_FORMAT,
                                                      "accept-encoding": "identity"})
        except httpx.HTTPError as exc:
            await _answer(send, 502, {"error": {"message": "the engine's /metrics did not "
                                                f"answer: {type(exc).__name__}"}})
            return
        kind = response.headers.get("content-type", "")
        if response.status_code != 200 or not kind.startswith("text/plain"):
            # Passed on as it came: another format would not take the verdicts after it.
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": _response_headers(response.headers, keep_length=False)})
            await send({"type": "http.response.body", "body": response.content})
            return
        own = self.render()
        text = response.content
        if text and not text.endswith(b"\n"):
            text += b"\n"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()), _date()]})
        await send({"type": "http.response.body", "body": text + own})


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


def _request_headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        if name not in _HOP_BY_HOP:
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    # httpx would add its own accept-encoding where the client sent none.
    headers.setdefault("accept-encoding", "identity")
    return headers


def _response_headers(headers: httpx.Headers, *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    drop = _HOP_BY_HOP - ({"content-length"} if keep_length else set())
    passed = [(k.encode("latin-1"), v.encode("latin-1"))
              for k, v in headers.multi_items() if k.lower() not in drop]
    # RFC 9110 6.6.1: a recipient with a clock forwarding a response without one adds it.
    return passed if "date" in headers else [*passed, _date()]


def _date() -> tuple[bytes, bytes]:
    """A ``date`` header for now, as uvicorn would have written it."""
    return (b"date", email.utils.formatdate(usegmt=True).encode())


async def _watch_disconnect(receive: Receive) -> None:
    """Returns once the client went away (the forwarding is then cancelled)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), _date()]})
    await send({"type": "http.response.body", "body": data})


def _prompts(prompt: Any) -> int:
    """How many prompts a completions request's ``prompt`` holds: vLLM runs each of a
    list of texts or of token lists as a request of its own, streamed as choices
    ``prompt_idx * n + i``; a text or one list of token ids is one."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1


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
