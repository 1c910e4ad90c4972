"""The meter's ASGI app: every request forwarded to vLLM, streams judged as written.

- Each request's body is read whole (at most ``max_body_bytes``: 413 past it, before a
  byte of it is read where its Content-Length says so), each piece once the bodies held
  leave it room (``body_budget``), sent on to the upstream with the client's method,
  path, query and headers (hop-by-hop ones dropped: ``asgi_http``), and let go once
  sent; the answer is streamed back piece by piece as it comes.
- A streamed completion (``request_plan``: which are judged, and how) is read as it is
  written (``StreamJudge``), each piece stamped once its send returned: the kernel took
  it with at most ``SEND_AHEAD_BYTES`` unsent ahead of it (``send_ahead``), the closest
  the meter sees to its client having it, read in steps that let the loop relay the
  other streams between them (``_read``), and judged at its end against the objectives
  of its class as they stood at its arrival. Its arrival is when its last byte (the end
  of its body) reached the meter's kernel, as the server's protocol stamped it
  (``http_arrival``), not when the app was called (for a request pipelined behind
  another on one connection, a whole answer later) nor when the loop read them (a busy
  or stopped loop's wait counts); a client's slow upload is its own link's time.
- A client that goes away has the upstream request closed at once, so vLLM aborts it
  and frees its cache rather than generating for nobody.
- Each judged stream's first tokens and token gaps are observed as they are written
  (``ClientLatency``): the TTFT and TBT its client saw, which the rules read on a vLLM
  deployment where vLLM's own leave out its frontend's work.
- Each request for generation is counted as it is forwarded (``arrivals``: as many as
  vLLM serves it as, ``Plan.arrivals``), whatever becomes of it: vLLM drops a request
  whose client gave up from every series it observes at the finish, and the workload
  probe reads its arrivals from this count where a replica exports it. A completions
  batch counts its first prompt's choices so, its other prompts' once the engine
  answered (``Plan.at_once``), and a stream cut short before is judged for those first
  ones alone. One the engine
  refuses as invalid (``is_invalid``: no load, however fast a client retries it) is
  counted again as such (``invalid``) once its status comes, and the probe takes it off:
  counted at the status instead, a body's arrival would wait for its end, and a client
  gone before any status would not be counted at all.
- A request for generation refused at the connection cap (``count_cap_refusal``) is an
  arrival of the meter's class never forwarded, counted in ``refused`` and judged a miss
  of its objectives: the rules read it as a first token never given. The meter serves one
  class (``--priority-class``), whatever the request's header says, so the cap, which
  reads no body, knows its class.
- Each request for generation is in ``in_flight`` from when it is forwarded until its
  exchange ends, however it ends (answered, the client gone, the engine failed or broke
  off, cancelled): the stall rule's word on whether a vLLM replica has work, where
  vLLM's own running and waiting gauges may hold their last step's values.
- ``GET /metrics`` is vLLM's exposition with the meter's own after it (``exposition``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

import httpx

from slopilot.engine.alert_factors import DEFAULT_FACTORS, AlertFactors
from slopilot.engine.awaiting import past_target
from slopilot.engine.body_items import ItemLimit, within
from slopilot.engine.connection_cap import ConnectionCap
from slopilot.engine.http_arrival import SCOPE_KEY
from slopilot.engine.http_deadlines import DISCONNECTED_KEY
from slopilot.engine.json_items import JsonItems
from slopilot.engine.meter import exposition
from slopilot.engine.meter.asgi_http import (
    Receive,
    Scope,
    Send,
    answer,
    request_headers,
    response_headers,
)
from slopilot.engine.meter.body_budget import BODY_BUDGET_MIB, MAX_BODY_MIB, BodyBudget, Hold
from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.meter.model_context import ModelContext
from slopilot.engine.meter.request_plan import (
    JUDGED_PATHS,
    Buffer,
    RequestPlanner,
    is_replay,
)
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.meter.stream_judge import StreamJudge
from slopilot.engine.metrics_text import render
from slopilot.engine.openai_errors import error_body
from slopilot.engine.request import Priority

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_BODY_MIB << 20
"""A request body larger than this is refused (413), by default (``--max-body-mb``): the
meter holds a body whole before it forwards it, within its memory (``body_budget``)."""
BODY_BUDGET_BYTES = BODY_BUDGET_MIB << 20
"""The bytes of the bodies held at once, by default (``--body-budget-mb``)."""
SEND_BYTES = 64 << 10
"""The most bytes of a body handed to the upstream's connection at once (each a copy)."""
VLLM_KEEP_ALIVE_S = 5.0
"""How long vLLM's server keeps an idle connection (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, its
uvicorn's ``timeout_keep_alive``; 5 s by default)."""
UPSTREAM_IDLE_S = 2.0
"""How long the meter keeps an idle connection to vLLM for reuse: well under vLLM's own.
httpx's default is 5 s, vLLM's too, so a request sent on a connection vLLM was closing
that instant failed (a 502 to a client vLLM would have served)."""


@dataclasses.dataclass(eq=False)
class _Exchange:
    """One request's judge (None: not a stream the meter judges), counted once. Hashed
    by identity: the meter keeps those running in a set (``Meter.awaiting``)."""

    judge: StreamJudge | None = None
    counted: bool = False
    in_flight: bool = False
    """A request for generation forwarded, in ``Meter.in_flight`` until its exchange ends."""


class _ClientGone(Exception):
    """The client went away before its request was whole."""


class _TooManyItems(Exception):
    """The body for generation holds more JSON items than ``limit`` allows."""

    def __init__(self, limit: ItemLimit) -> None:
        super().__init__(limit.max_items)
        self.limit = limit


class Meter:
    """The ASGI app. ``clock``: when a piece was written, and when a request arrived where
    its server stamped none (monotonic seconds; the server's protocol stamps on this
    clock too, ``commands.uvicorn_config``)."""

    def __init__(self, upstream: str, slo: SLOWatch, priority: Priority, *,
                 client: httpx.AsyncClient | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_body_bytes: int = MAX_BODY_BYTES,
                 body_budget_bytes: int = BODY_BUDGET_BYTES,
                 max_model_len: int | None = None,
                 alert_factors: AlertFactors = DEFAULT_FACTORS) -> None:
        self.upstream = upstream.rstrip("/")
        self.upstream_url = httpx.URL(self.upstream)
        self.slo, self.priority, self.clock = slo, priority, clock
        self.verdicts = slo.verdicts
        self.latency = ClientLatency(priority, slo.current(), alert_factors)
        """Each judged stream's first tokens and gaps, observed as written; the SLO at
        the start gives their histograms its thresholds, at ``alert_factors``, as edges."""
        if not 1 <= max_body_bytes <= body_budget_bytes:
            raise ValueError(f"max_body_bytes={max_body_bytes}: expected at least 1 and at "
                             f"most body_budget_bytes ({body_budget_bytes}), or a body of "
                             "the cap would wait for room for ever")
        self.max_body_bytes = max_body_bytes
        self.budget = BodyBudget(body_budget_bytes)
        """The bodies held at once: each from its first byte until it was sent on."""
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
        self.planner = RequestPlanner(slo, priority, self.latency)
        """How each request is forwarded, and judged."""
        self.registry = exposition.own_registry(self)
        self.replays = 0
        """Responses streamed again (``is_replay``), passed on unjudged."""
        self.arrivals = 0
        """The requests for generation forwarded (``Plan.arrivals``), each as it came."""
        self.invalid = 0
        """Of ``arrivals``, those the engine answered as invalid (``is_invalid``)."""
        self.refused = 0
        """Of ``arrivals``, those refused at the connection cap (``count_cap_refusal``)."""
        self.running: set[_Exchange] = set()
        """The exchanges under way, whose judged streams' choices may still wait for a
        first token (``awaiting``)."""
        self.in_flight = 0
        """The requests for generation forwarded whose exchange has not ended: vLLM's own
        gauges may hold their last step's values once every request was aborted."""
        self.connection_cap: ConnectionCap | None = None
        """The slots of ``--max-connections`` (``count_connections``)."""
        self.model_context = ModelContext(max_model_len)
        """vLLM's context, ``max_model_len`` (``--max-model-len``) or else learned from its
        ``/v1/models`` from startup on: the bound on a body's JSON items
        (``body_items``)."""
        self._learning: asyncio.Task[None] | None = None

    def count_connections(self, cap: ConnectionCap) -> None:
        """Serve ``cap``'s counts after the meter's own series (its server's cap)."""
        self.connection_cap = cap
        self.registry.register(cap)

    def count_cap_refusal(self, scope: Scope) -> None:
        """A request the connection cap refused (``connection_cap.CountRefusal``): one
        for generation (a POST to ``JUDGED_PATHS``, streamed or not: the body is unread)
        is an arrival of the meter's class, refused, and a miss of its objectives as
        they stand, with no token, as the built-in engine counts a 429."""
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if scope.get("method") != "POST" or not raw_path.startswith(b"/"):
            return
        # Read as ``_forward`` reads it: the path the engine would have been asked for.
        if self.upstream_url.copy_with(raw_path=raw_path).path not in JUDGED_PATHS:
            return
        self.arrivals += 1
        self.refused += 1
        slo = self.slo.current().class_slo(self.priority)
        self.verdicts.observe(self.priority, slo, met=False, tokens=0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: vLLM's OpenAI API has none
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._too_large(send, str(declared))
            return
        hold = self.budget.hold()
        try:
            await self._exchange(scope, receive, send, hold)
        finally:
            hold.release()

    async def _exchange(self, scope: Scope, receive: Receive, send: Send,
                        hold: Hold) -> None:
        # A body for generation is vLLM's to parse on its loop: its items are counted as
        # it arrives, and past the bound it is refused unparsed, counted nowhere (as a
        # body past the byte cap: the meter's own 413, not the engine's).
        items = self.model_context.limit() if _for_generation(scope, self.upstream_url) \
            else None
        try:
            body = await self._body(receive, hold, items)
        except _ClientGone:
            return  # gone before its request was whole: nothing to forward to anyone
        except _TooManyItems as refused:
            await answer(send, 413, error_body(413, refused.limit.message(
                "the meter in front of this engine", "a")))
            return
        if body is None:
            await self._too_large(send, f"over {self.max_body_bytes}")
            return
        # Read only now: the protocol moves the stamp to the body's last byte once it
        # has it (``http_arrival``), and the body was read whole.
        stamp = scope.get(SCOPE_KEY)
        arrival = float(stamp) if stamp is not None else self.clock()
        exchange = _Exchange()
        self.running.add(exchange)
        forward = asyncio.ensure_future(self._forward(scope, body, send, arrival, exchange,
                                                      hold))
        del body  # the forwarding's alone, to let go of once sent
        watch = asyncio.ensure_future(_watch_disconnect(receive))
        try:
            await asyncio.wait({forward, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (forward, watch):
                task.cancel()
            await asyncio.gather(forward, watch, return_exceptions=True)
            # The client left, or the engine's answer broke off: judged as cut short.
            self._count(exchange)
            self.running.discard(exchange)
            # Here, where every end passes: answered, the client gone, the engine
            # failed or broke off, the forwarding cancelled.
            if exchange.in_flight:
                exchange.in_flight = False
                self.in_flight -= 1
        if forward.done() and not forward.cancelled() and (exc := forward.exception()):
            raise exc

    async def _too_large(self, send: Send, size: str) -> None:
        await answer(send, 413, error_body(
            413, f"the request body is {size} bytes; the meter in front of this engine "
            f"accepts at most {self.max_body_bytes} bytes (--max-body-mb): send a shorter "
            "prompt or split the batch"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # In the background: vLLM loads its model for minutes after the meter
                # starts, and the meter serves meanwhile (probes, scrapes).
                self._learning = asyncio.ensure_future(
                    self.model_context.watch(self.client, self.upstream))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._learning is not None:
                    self._learning.cancel()
                    await asyncio.gather(self._learning, return_exceptions=True)
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _body(self, receive: Receive, hold: Hold,
                    items: ItemLimit | None = None) -> bytearray | None:
        """The request's body, each piece once the bodies held leave it room (``hold``);
        None past ``max_body_bytes``; ``_TooManyItems`` past ``items`` (counted as each
        piece comes, in steps the loop runs between: ``body_items.within``). One buffer
        as it comes: its pieces joined at the end were the body twice over."""
        body = bytearray()
        scan = JsonItems() if items is not None else None
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > self.max_body_bytes:
                return None
            await hold.grow(len(chunk))
            if scan is not None and items is not None and \
                    not await within(scan, chunk, items.max_items):
                raise _TooManyItems(items)
            body += chunk
            if not message.get("more_body"):
                return body

    async def _forward(self, scope: Scope, body: bytearray, send: Send, arrival: float,
                       exchange: _Exchange, hold: Hold) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if not raw_path.startswith(b"/"):
            # The target is the client's to write: glued to the upstream's URL,
            # "@host/..." named another host, reached from the pod with the client's
            # request. Only a path goes on, and into the path alone.
            await answer(send, 400, error_body(
                400, "the request target must be a path, e.g. /v1/completions",
                code="invalid_request_target"))
            return
        query: bytes = scope.get("query_string", b"")
        url = self.upstream_url.copy_with(raw_path=raw_path + (b"?" + query if query else b""))
        # Every decision reads the path the engine is asked for: httpx removes dot
        # segments, so "/v1/./completions" is served as /v1/completions, and read by the
        # client's spelling it was a stream that went unjudged.
        if scope["method"] == "GET" and url.path == "/metrics":
            await exposition.scrape(self.client, self.upstream, send, self.render)
            return
        plan = await self.planner.plan(scope["method"], url.path, body, arrival)
        del body
        self.arrivals += plan.at_once
        if plan.arrivals:
            exchange.in_flight = True
            self.in_flight += 1
        judge = exchange.judge = plan.judge
        strip, arrivals, at_once = plan.strip, plan.arrivals, plan.at_once
        headers = request_headers(scope)
        if judge is not None:
            headers["accept-encoding"] = "identity"  # SSE read as written, not compressed
        size = sum(len(piece) for piece in plan.body)
        if size:
            headers["content-length"] = str(size)
        request = self.client.build_request(
            scope["method"], url, headers=headers,
            content=_Outgoing(plan.body, hold) if size else b"")
        del plan  # its body is the request's, let go of once sent
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("%s %s: the engine did not answer: %s", scope["method"],
                        scope["path"], type(exc).__name__)
            await answer(send, 502, error_body(
                502, f"the engine beside the meter did not answer: {type(exc).__name__}",
                code="upstream_unavailable"))
            return
        # The engine took the request whole: a batch's other prompts are its too.
        self.arrivals += arrivals - at_once
        if judge is not None:
            judge.n = arrivals
        if is_invalid(response.status_code):
            self.invalid += arrivals
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
                        "headers": response_headers(response.headers,
                                                    keep_length=strip is None)})
            gone: Callable[[], bool] = scope.get(DISCONNECTED_KEY, _never_gone)
            try:
                async for piece in response.aiter_raw():
                    passed = piece if strip is None else strip.feed(piece)
                    if passed:
                        await send({"type": "http.response.body", "body": passed,
                                    "more_body": True})
                    if gone():
                        # The connection was lost while the piece waited to be written
                        # (the client left, or the send deadline let it go): it reached
                        # no one, and uvicorn's send drops the rest without a pause, so
                        # an engine faster than the loop was read to its end for nobody
                        # before the disconnect's cancellation came round.
                        return
                    if judge is not None:
                        await _read(judge, piece, self.clock())
                        if judge.model is not None:
                            # From its first chunk on: the histograms it fed are labelled so.
                            self.model_name = judge.model
            except httpx.HTTPError as exc:
                # The engine broke off (a pod killed, OOM): its failure, a line each, not
                # a traceback of the server's per stream. The answer is left unfinished,
                # as the engine left it: the server closes the client's connection.
                log.warning("%s %s: the engine broke off its answer: %s", scope["method"],
                            scope["path"], type(exc).__name__)
                return
            if strip is not None and (rest := strip.flush()):
                await send({"type": "http.response.body", "body": rest, "more_body": True})
            # Counted before the end is sent: a response complete reads, to the server,
            # as a client gone (uvicorn), which cancels this task.
            self._count(exchange)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    def render(self) -> bytes:
        """The meter's own exposition: the verdicts, the client-side histograms, the
        replays, the arrivals and the invalid ones, in that order. Byte for byte
        ``generate_latest(self.registry)``, its histograms written as their kept text
        (``metrics_text``): it runs on the loop that relays every stream's chunks, and
        holds them all while it runs."""
        return render(self.registry)

    def awaiting(self) -> dict[bool, int]:
        """The choices of the judged streams under way given no first token yet, by
        whether their client has waited within its TTFT target (``past_target``, the
        engine's rule): exported at each scrape (``CLIENT_AWAITING``), so a class starved
        of first tokens reads as missing them before its clients give up."""
        out = {False: 0, True: 0}
        now = self.clock()
        for exchange in self.running:
            judge = exchange.judge
            if judge is None or exchange.counted:
                continue
            if missed := judge.first_tokens_missed():
                out[not past_target(judge.slo, now - judge.arrival)] += missed
        return out

    def _count(self, exchange: _Exchange) -> None:
        """The stream's verdicts, and its choices given no first token, once, as it
        ended now."""
        judge = exchange.judge
        if judge is None or exchange.counted:
            return
        exchange.counted = True
        now = self.clock()
        for verdict in judge.verdicts(now):
            self.verdicts.observe(self.priority, judge.slo, met=verdict.met,
                                  tokens=verdict.tokens, requests=verdict.choices)
        self.latency.never_first(judge.first_tokens_missed(),
                                 within_target=judge.left_within_ttft(now))


class _Outgoing:
    """A body as the upstream's connection takes it, ``SEND_BYTES`` a piece; once sent,
    its bytes let go and its room in the budget given back (a stream runs for minutes
    after its body was sent)."""

    def __init__(self, pieces: tuple[Buffer, ...], hold: Hold) -> None:
        self._pieces, self._hold = pieces, hold

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            for piece in self._pieces:
                view = memoryview(piece)
                for start in range(0, len(view), SEND_BYTES):
                    yield bytes(view[start:start + SEND_BYTES])
        finally:
            self._pieces = ()
            self._hold.release()


def _for_generation(scope: Scope, upstream: httpx.URL) -> bool:
    """Whether the request asks for generation: a POST to ``JUDGED_PATHS`` as the engine
    is asked for it (httpx removes dot segments, as ``_forward`` sends it)."""
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
    if scope.get("method") != "POST" or not raw_path.startswith(b"/"):
        return False
    try:
        return upstream.copy_with(raw_path=raw_path).path in JUDGED_PATHS
    except httpx.InvalidURL:
        return False  # ``_forward`` answers it


def _declared_length(scope: Scope) -> int | None:
    """The body's length as its head declares it: its Content-Length, else none (0) but
    where it comes in chunks, of a length unknown (None)."""
    length = 0
    for name, value in scope.get("headers", ()):
        if name.lower() == b"transfer-encoding":
            return None
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None  # the HTTP parser refuses a malformed one itself
    return length


def is_invalid(status: int) -> bool:
    """Whether the engine refused a request as its client's error (400 or 422: a prompt
    past the context, a bad parameter; 404: no such model; 413: too large), which it
    never serves. Not 429: turned away for load, which was offered; nor a 5xx: the
    engine failed it under its load."""
    return 400 <= status < 500 and status != 429


async def _read(judge: StreamJudge, piece: bytes, at: float) -> None:
    """``piece``, written at ``at``, read by ``judge`` in its steps, the loop let run at
    each: an event past 1 MiB read in one go stalled every other stream's relay.

    Read to the piece's end even where the forwarding is cancelled meanwhile (its client
    left): the piece reached the client, and its verdict is counted once the
    cancellation is through (``Meter.__call__``), as of a piece read in one go."""
    cancelled: asyncio.CancelledError | None = None
    for _ in judge.read_steps(piece, at):
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled


def _never_gone() -> bool:
    """A server that does not say when a connection is lost (no ``DISCONNECTED_KEY``):
    the disconnect's watch alone ends the forwarding."""
    return False


async def _watch_disconnect(receive: Receive) -> None:
    """Returns once the client went away (the forwarding is then cancelled)."""
    while (await receive())["type"] != "http.disconnect":
        pass
