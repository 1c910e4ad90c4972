"""Token streams to OpenAI responses: one JSON body (``collect``) or SSE chunks.

Each choice (an engine request) has its own stream and decoder; the choices of one
HTTP request are read together, as their tokens arrive, so ``n`` choices or a batch of
prompts stream interleaved, each chunk naming its choice ``index``.

A stream's usage is written where and as vLLM writes it, so a client (or the meter,
which asks every stream for it) reads the same bytes from either: with
``stream_options.include_usage`` a last chunk of the request's usage and no choices;
with ``continuous_usage_stats`` each chunk's usage too, its choice's tokens so far. A
completions chunk writes every field (``"usage": null`` without them), a chat chunk
only the ones set.

TTFT and end-to-end latency are observed here, per choice, as the client sees them:
from the request's arrival at the server (stamped before the body was parsed) to the
moment the chunk carrying its first output was written (streaming), or the first token
reached the handler (a non-streamed response has no earlier moment the client could
see); and to the moment its last chunk was written (streaming), or the whole body was
sent; the finish reason is counted then too, as the client got it. ``Delivery`` holds
both stamps and the cleanup; the route's response runs that cleanup after sending,
whatever happened, so every engine request is observed once.
Inter-token latency is observed here for the tokens handed out only, as vLLM's frontend
does, and as the client sees it: in a stream, one gap a chunk that brings tokens after
the first, the time since the last such chunk to the moment this one was written,
however many tokens it brings (``ClientGaps``, as ``vllm bench serve`` times them; a
busy event loop shows in it, as on the client's side, and a slow connection within
``send_ahead``'s bound: a chunk is "written" once the kernel took it with at most 16 KiB
unsent ahead of it, not once the client read it); in a body, which shows no gap, the
engine's gap between a token and the one before (one an iteration: vLLM's, one an engine
output). A stream's gaps are therefore no count of its tokens: those are counted apart
(``ChoiceState.hand_out``: ``vllm:generation_tokens_total``), once their chunk was
written, or the whole body sent, so a client that left before its body went out got,
and counts, none.
Where the server knows the deployment's SLO, each choice is judged once delivered
against its class's objectives as they stood when it arrived (``ClassSLO.met`` on that
TTFT and those gaps, the simulator's rule), and counted with the tokens the client got:
the per-request goodput that histograms of first tokens and of gaps cannot give. One cut
short (the client left, a drain or a failed engine ended it) is judged only where it had
missed already (``ChoiceState.verdict``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from slopilot.engine.client_gaps import ClientGaps
from slopilot.engine.http_deadlines import DISCONNECTED_KEY
from slopilot.engine.request import FinishReason, TokenLogprobs
from slopilot.engine.scheduler import DisplacedError
from slopilot.engine.server.async_engine import (
    DrainedError,
    EngineDeadError,
    EngineDrainingError,
)
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.detokenizer import IncrementalDetokenizer
from slopilot.engine.server.errors import APIError, error_body
from slopilot.engine.server.logprobs_format import (
    TextOffsets,
    TokenText,
    chat_logprobs,
    completion_logprobs,
    prompt_offsets,
)
from slopilot.engine.server.request_stream import RequestStream, StreamDelta
from slopilot.engine.server.serving import Choice, Prepared
from slopilot.engine.slo import SLOSpec

# now() on the engine's clock, the one arrival times are stamped with.
Clock = Callable[[], float]


class ChoiceState:
    """Text, finish reason and logprobs of one choice, delta by delta."""

    def __init__(self, backend: Backend, prep: Prepared, choice: Choice,
                 stream: RequestStream, slo: SLOSpec | None) -> None:
        self.choice, self.stream, self.prep = choice, stream, prep
        self.metrics = backend.metrics
        self.detok = IncrementalDetokenizer(backend.tokenizer, choice.prompt.token_ids,
                                            prep.stop,
                                            min_tokens=choice.request.sampling.min_tokens)
        self.token_ids: list[int] = []
        self.finish: str | None = None
        # The text_offset of each output token given logprobs, from the tokens' own bytes
        # (``TextOffsets``), not from the text sent so far, which a stop string holds
        # back while streaming: so a stream's offsets are the body's. Under echo the
        # outputs' text follows the prompt's.
        self.offsets = TextOffsets(len(self.echo_text()) if prep.echo else 0)
        self.first_written = False  # a chunk with output went out (TTFT is observed)
        self.last_made_at: float | None = None  # when the engine made the last token fed
        self.written = ClientGaps()  # a stream's gaps, as its chunks went out
        # Tokens (and their gaps) count once they reach the client, not once fed: a
        # non-streamed body that is never sent hands out none.
        self.handed = 0
        self.unhanded_gaps: list[float] = []
        self.delivered = False  # its last chunk went out (e2e latency is observed)
        # What it is judged by (None: no SLO known); the objectives of its arrival, so
        # an SLO changed mid-request does not judge half of it by each.
        self.slo = None if slo is None else slo.class_slo(choice.request.priority)
        self.tbt_s = None if self.slo is None or self.slo.tbt_p99_ms is None \
            else self.slo.tbt_p99_ms / 1000.0
        self.ttft_s: float | None = None
        self.gaps = 0
        self.gaps_over = 0

    def feed(self, delta: StreamDelta) -> tuple[str, list[int]]:
        """The new text, and the ids of the tokens it brings (for their logprobs)."""
        token_ids, finish = delta.token_ids, delta.finish_reason
        shown = token_ids
        if finish is FinishReason.STOP and token_ids and token_ids[-1] in self.prep.stop_ids:
            shown = token_ids[:-1]  # the stop token itself is not output text
        taken = self.detok.add(shown, final=finish is not None)
        if self.detok.stopped:
            # One delta may bring several tokens (the loop was busy, the engine fast):
            # those after the one that completed the stop string never reach the client.
            token_ids = token_ids[:taken]
        start = len(self.token_ids)
        # What the engine makes after a stop string matched never gets here (the choice
        # is done), nor into usage; nor do its token gaps.
        self.token_ids += token_ids
        for made_at in delta.token_times[:len(token_ids)]:
            if self.last_made_at is not None:
                self.unhanded_gaps.append(made_at - self.last_made_at)
            self.last_made_at = made_at
        if self.detok.stopped:
            self.finish = FinishReason.STOP.value
            self.stream.abort(stopped=True)  # a stop string: the engine need not go on
        elif finish is not None:
            self.finish = finish.value
        return self.detok.take(final=self.finish is not None), \
            list(range(start, start + len(token_ids)))

    def hand_out(self, written_at: float | None = None) -> None:
        """Count the tokens fed since the last call, and their gaps: they reached the
        client, in a chunk written at ``written_at`` (streaming), or in the whole body
        (None).

        A stream's gaps are the ones its client measures (``ClientGaps``: one a chunk,
        the time since the last chunk that brought tokens, whatever this one brings). A
        body shows its client no gap at all, so its gaps are the engine's, as made (vLLM's
        frontend observes those for both)."""
        n = len(self.token_ids) - self.handed
        self.metrics.count_delivered(n)
        self.handed = len(self.token_ids)
        if written_at is None:
            gaps = self.unhanded_gaps
        else:
            gap = self.written.written(n, written_at)
            gaps = [] if gap is None else [gap]
        priority = self.choice.request.priority
        for gap in gaps:
            self.metrics.observe_token_gap(priority, gap)
        self.gaps += len(gaps)
        self.gaps_over += self._over(gaps)
        self.unhanded_gaps = []

    def _over(self, gaps: list[float]) -> int:
        """How many of ``gaps`` lie over the class's TBT target (none without one)."""
        tbt = self.tbt_s
        return 0 if tbt is None else sum(1 for gap in gaps if gap > tbt)

    def verdict(self, waited_s: float) -> bool | None:
        """Whether it met its class's SLO (``ClassSLO.met``); None: it cannot be told.

        One that ran to its end, every token handed out, is judged on them. One without a
        token that ended normally has nothing to judge, as in the simulator
        (SLOJudge.finished). One cut short (the client left, a drain or a failed engine
        ended it, its last tokens never sent) is judged only where it had already missed,
        whatever would have followed: no first token within the TTFT target (delivered,
        or by ``waited_s``, when it ended), or more slow gaps than 1 % of all it could
        have had. Else its end could still have met the SLO: "met" would credit the
        tokens it got with a verdict nobody measured, and "missed" would let any client
        that leaves early count against the config. Unjudged, the clients an overloaded
        class drove away vanished from its goodput share.
        """
        slo = self.slo
        if slo is None:
            return None
        whole = self.handed == len(self.token_ids) and \
            self.finish not in (None, FinishReason.ABORT.value)
        if whole:
            return None if not self.token_ids or self.ttft_s is None else \
                slo.met(self.ttft_s, self.gaps, self.gaps_over)
        first_s = self.ttft_s if self.handed and self.ttft_s is not None else waited_s
        most_gaps = self.choice.request.sampling.max_tokens - 1
        # Tokens made and never handed out count by the gaps they were made with: they
        # could reach the client no sooner.
        over = self.gaps_over + self._over(self.unhanded_gaps)
        if not slo.met(first_s, most_gaps, over):
            return False
        return None

    def logprobs(self, positions: list[int], text_of: TokenText, *, echo: bool) -> Any:
        """The choice's logprobs object for these output positions (and the prompt's)."""
        prep, req = self.prep, self.choice.request
        if prep.logprobs is None:
            return None
        k = prep.logprobs
        entries = [req.output_logprobs[i] for i in positions if i < len(req.output_logprobs)]
        ids = [self.token_ids[i] for i in positions][:len(entries)]
        if prep.chat:
            return chat_logprobs(text_of, entries, k)
        all_entries: list[TokenLogprobs | None] = list(entries)
        offsets = [self.offsets.next(text_of.shown(t)) for t in ids]
        if echo:
            prompt_ids = self.choice.prompt.token_ids
            all_entries = [None, *req.prompt_logprobs[:len(prompt_ids) - 1], *entries]
            ids = [*prompt_ids, *ids]
            offsets = [*prompt_offsets(text_of, prompt_ids, self.echo_text()), *offsets]
        return completion_logprobs(text_of, ids, all_entries, k, offsets)

    def echo_text(self) -> str:
        return self.choice.prompt.text or ""


def _usage(prep: Prepared, states: list[ChoiceState]) -> dict[str, int]:
    """The request's usage: each prompt once (not once per choice), every choice's
    tokens; in vLLM's field order (its ``UsageInfo``)."""
    prompt = sum(len(p.token_ids) for p in prep.prompts)
    completion = sum(len(s.token_ids) for s in states)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}


async def _deltas(states: list[ChoiceState]) -> AsyncIterator[tuple[ChoiceState, StreamDelta]]:
    """Every choice's deltas, in arrival order, until each has finished."""
    wakeup = asyncio.Event()
    for s in states:
        s.stream.wakeup = wakeup
    live = list(states)
    while live:
        wakeup.clear()
        for s in list(live):
            delta = s.stream.poll()
            if delta is not None:
                yield s, delta
            if s.stream.finished or s.finish is not None:
                live.remove(s)
        # Deltas are pushed on this loop only, so one that came during a yield above
        # has set the event again: waiting cannot miss it.
        if live and not wakeup.is_set():
            await wakeup.wait()


class Delivery:
    """The choices of one HTTP request on their way to the client, and their stamps.

    Lives on the event loop. ``close`` ends what is still running and observes the e2e
    latency of each choice not yet observed (aborted, failed, or a non-streamed body
    just sent); it is idempotent, so the generator and the response may both call it.
    """

    def __init__(self, backend: Backend, prep: Prepared, streams: list[RequestStream],
                 clock: Clock, *, slo: SLOSpec | None) -> None:
        """``slo``: the server's when the request arrived (``EngineMetrics.slo``)."""
        self.backend, self.prep, self.streams, self.clock = backend, prep, streams, clock
        self.states = [ChoiceState(backend, prep, c, s, slo)
                       for c, s in zip(prep.choices, streams, strict=True)]
        # Each waits for its first token from its arrival (``metric_names.AWAITING``)
        # until one reaches its client or it ends: a class starved of them is read so.
        for state in self.states:
            backend.metrics.awaiting.arrived(state, state.choice.request.priority, state.slo,
                                             state.choice.request.arrival_time, clock)
        # Each prompt's choices (prompt by prompt, ``n`` each): vLLM serves each prompt of
        # a batch as its own request, so its longest output is observed per prompt.
        self.per_prompt = max(1, len(self.states) // max(1, len(prep.prompts)))
        self.sent = False  # a non-streamed body went out whole (``body_sent``)
        # A retry is counted let in once, when settled: served a first output, or ended.
        self._retry_settled = not prep.retry
        # Whether the client's connection is lost, so what was "sent" reached no one:
        # the server's protocol says so in the scope (``DeliveredStream``), else never.
        self.gone: Callable[[], bool] = _connected

    async def started(self) -> bool:
        """Wait until some choice has news: a token, its end, or an error (True). Raises
        DisplacedError where its choices gave way in a full queue before any started,
        DrainedError where a drain ended them before any started: a stream's status
        goes out only after this, so that its client can still be answered 429 or 503
        (``openai_routes``)."""
        wakeup = asyncio.Event()
        for s in self.streams:
            s.wakeup = wakeup
        # Pushed on this loop only: one that came before the clear is seen by the check.
        while True:
            wakeup.clear()
            if any(s.has_news for s in self.streams):
                break
            await wakeup.wait()
        for s in self.streams:
            # The engine ends all of a request's choices so together, none with a token.
            if isinstance(s.error, (DisplacedError, DrainedError)):
                raise s.error
        return True

    def refused(self) -> None:
        """Its choices were refused before any started, so nothing here observes them:
        no latency, no finish reason, no verdict, no abandoned choice, no retry let in.
        Those that gave way in a full queue (``DisplacedError``) are a refusal for load,
        counted as one with their 429 (``serving.refused_for_load``); those a drain ended
        (``DrainedError``) are counted nowhere, as a 503 at the door while draining: the
        client is told to retry on another replica, which serves and counts it."""
        self._retry_settled = True
        for state in self.states:
            state.delivered = True
            self.backend.metrics.awaiting.settled(state)

    def _settle_retry(self) -> None:
        if not self._retry_settled:
            self._retry_settled = True
            for c in self.prep.choices:
                self.backend.metrics.count_retry_admitted(c.request.priority)

    def first_output(self, state: ChoiceState, at: float | None = None) -> None:
        """``state``'s first token reached the client (or, for a body, the handler) at
        ``at``: now, unless given. Not for an end with no token (a drain's abort, a
        failure): no first token was given, and its choice is counted so when it ends
        (``last_output``), not observed as one at the moment of its end."""
        self._settle_retry()
        if not state.first_written:
            state.first_written = True
            self.backend.metrics.awaiting.settled(state)
            req = state.choice.request
            state.ttft_s = (self.clock() if at is None else at) - req.arrival_time
            self.backend.metrics.observe_ttft(req.priority, state.ttft_s)

    def last_output(self, state: ChoiceState) -> None:
        if not state.delivered:
            state.delivered = True
            self.backend.metrics.awaiting.settled(state)
            req = state.choice.request
            e2e_s = self.clock() - req.arrival_time
            finish = state.finish or FinishReason.ABORT.value
            self.backend.metrics.observe_delivered(req.priority, e2e_s, state.handed, finish)
            if not state.first_written and finish == FinishReason.ABORT.value:
                # No first token reached its client (it left, a drain aborted it, the
                # answer failed): in no TTFT observation, so counted as never given,
                # unless it ended within its target (it missed nothing, as ``verdict``).
                within = state.slo is not None and state.slo.left_within_ttft(e2e_s)
                self.backend.metrics.count_abandoned(req.priority, within_target=within)
            met = state.verdict(e2e_s)
            if state.slo is not None and met is not None:
                self.backend.metrics.observe_verdict(req.priority, state.slo, met=met,
                                                     tokens=state.handed)
            # Each choice is delivered once, so this holds at exactly one call: the
            # prompt's last choice to end.
            first = state.choice.index // self.per_prompt * self.per_prompt
            siblings = self.states[first:first + self.per_prompt]
            if all(s.delivered for s in siblings):
                self.backend.metrics.observe_request_outputs(
                    req.priority, max(s.handed for s in siblings))

    def body_sent(self) -> None:
        """A non-streamed body went out whole: every choice's tokens reached the client."""
        self.sent = True
        for state in self.states:
            state.hand_out()

    def abort(self) -> None:
        """Stop every choice still running (a no-op for finished ones): the client went
        away, or the handler was cancelled."""
        for s in self.streams:
            s.abort()

    def close(self) -> None:
        self.abort()
        self._settle_retry()  # let in, and ended before any output (it was not refused)
        for state in self.states:
            if not state.delivered and not self.sent:
                # Its end never reached the client (it left, stopped reading, or the
                # response failed): cut short, however the engine finished it. Counted
                # as the engine's "length" before, a stream whose client never read its
                # last chunk was a request served whole.
                state.finish = FinishReason.ABORT.value
            self.last_output(state)


def _connected() -> bool:
    return False


def _gone_of(scope: Scope) -> Callable[[], bool]:
    """Whether the scope's connection is lost, as the protocol tells it (never, where
    it does not: an app served some other way)."""
    gone: Callable[[], bool] = scope.get(DISCONNECTED_KEY, _connected)
    return gone


class DeliveredJSON(JSONResponse):
    """A JSON body that closes its ``Delivery`` once sent (or once sending failed)."""

    def __init__(self, content: Any, delivery: Delivery) -> None:
        super().__init__(content)
        self.delivery = delivery

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _then_close(self._send(scope, receive, send), self.delivery)

    async def _send(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if not _gone_of(scope)():  # else the body went to no one
            self.delivery.body_sent()


class DeliveredStream(StreamingResponse):
    """SSE that closes its ``Delivery`` when the response ends, even one whose generator
    never started (the client left before the first chunk): its ``finally`` then never
    runs, and without this the choices would run on unobserved."""

    def __init__(self, delivery: Delivery, text_of: TokenText) -> None:
        super().__init__(sse_events(delivery, text_of), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.delivery = delivery

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.delivery.gone = _gone_of(scope)
        await _then_close(super().__call__(scope, receive, send), self.delivery)


async def _then_close(sending: Awaitable[None], delivery: Delivery) -> None:
    """Send the response, then close its ``Delivery`` however the sending ended."""
    try:
        await sending
    finally:
        delivery.close()


def engine_error(exc: BaseException) -> APIError:
    """What a client is told when the engine cannot serve (failed, or stopping)."""
    if isinstance(exc, EngineDeadError):
        return APIError(500, str(exc), code="engine_dead")
    return APIError(503, str(exc), code="draining")


async def collect(delivery: Delivery, text_of: TokenText) -> dict[str, object]:
    """Run every choice to its end; the whole OpenAI response body. The caller closes
    ``delivery`` once the body is sent (``DeliveredJSON``): that is the e2e stamp, and
    the moment its tokens count as handed out (``Delivery.body_sent``)."""
    backend, prep, states = delivery.backend, delivery.prep, delivery.states
    parts: list[list[str]] = [[] for _ in states]
    try:
        async for state, delta in _deltas(states):
            if delta.token_ids:
                delivery.first_output(state)
            parts[state.choice.index].append(state.feed(delta)[0])
    except DrainedError:
        raise  # before any choice started: the route refuses it (``Delivery.refused``)
    except (EngineDeadError, EngineDrainingError) as exc:
        raise engine_error(exc) from None
    finally:
        delivery.abort()
    choices = []
    for state in states:
        text = "".join(parts[state.choice.index])
        choice: dict[str, object] = {"index": state.choice.index,
                                     "finish_reason": state.finish}
        choice["logprobs"] = state.logprobs(list(range(len(state.token_ids))), text_of,
                                            echo=prep.echo)
        if prep.return_token_ids:
            choice["prompt_token_ids"] = state.choice.prompt.token_ids
            choice["token_ids"] = state.token_ids
        if prep.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = (state.echo_text() if prep.echo else "") + text
        choices.append(choice)
    body: dict[str, object] = {
        "id": prep.request_id, "created": prep.created, "model": backend.served_model_name,
        "object": "chat.completion" if prep.chat else "text_completion",
        "choices": choices, "usage": _usage(prep, states)}
    if prep.return_token_ids and len(prep.prompts) == 1:
        body["prompt_token_ids"] = prep.prompts[0].token_ids
    return body


def _sse_with_usage(payload: dict[str, object], state: ChoiceState, *,
                    details: bool) -> str:
    """``payload`` as an SSE chunk with its continuous usage last, as vLLM writes it:
    its choice's prompt and the tokens it got so far (``previous_num_tokens[i]``: per
    choice, not per request; 0 before the first); ``details``: a completions chunk's
    ``"prompt_tokens_details": null`` (it writes every field).

    Counts only, so written straight into the chunk's JSON: a usage dict serialized
    with every chunk cost the writer about 0.7 us a chunk (a tenth of its time), this
    about 0.25 (``benchmarks/stream_usage_cost.py``)."""
    prompt, so_far = len(state.choice.prompt.token_ids), len(state.token_ids)
    tail = ',"prompt_tokens_details":null' if details else ""
    body = json.dumps(payload, separators=(",", ":"))
    return (f'data: {body[:-1]},"usage":{{"prompt_tokens":{prompt},'
            f'"total_tokens":{prompt + so_far},"completion_tokens":{so_far}{tail}}}}}\n\n')


def _sse(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def sse_events(delivery: Delivery, text_of: TokenText) -> AsyncIterator[str]:
    """SSE ``data:`` chunks, then ``data: [DONE]``; a closed client aborts the request."""
    backend, prep, states = delivery.backend, delivery.prep, delivery.states
    obj = "chat.completion.chunk" if prep.chat else "text_completion"
    base: dict[str, object] = {"id": prep.request_id, "object": obj,
                               "created": prep.created, "model": backend.served_model_name}
    continuous = prep.continuous_usage

    def chunk(state: ChoiceState, text: str | None, finish: str | None,
              logprobs: Any = None, role: bool = False) -> str:
        index = state.choice.index
        if prep.chat:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, object] = {"index": index, "delta": delta,
                                         "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs,
                      "finish_reason": finish}
        out = {**base, "choices": [choice]}
        # Where vLLM writes it: a completions chunk has every field (null without
        # continuous stats), a chat chunk only those set (none without them).
        if continuous:
            return _sse_with_usage(out, state, details=not prep.chat)
        if not prep.chat:
            out["usage"] = None
        return _sse(out)

    # A chat stream's role chunks go out with its first output, as vLLM writes them
    # (``serving_chat.py``, ``first_iteration``): a client timing chunks (``vllm bench
    # serve`` takes TTFT at the first with choices) would read one written before any
    # token as a first token come at once, and the wait for the real one as a gap.
    roles = prep.chat
    try:
        async for state, delta in _deltas(states):
            if roles:
                roles = False
                for each in states:
                    yield chunk(each, "", None, role=True)
            text, positions = state.feed(delta)
            echo = prep.echo and not state.first_written
            if echo:
                text = state.echo_text() + text
            logprobs = state.logprobs(positions, text_of, echo=echo) if positions else None
            wrote = False
            if text or logprobs is not None:
                # The last tokens' chunk says how the choice finished, as vLLM writes it:
                # an empty chunk after it reads, to a client timing each chunk, as one
                # more token come at once (vLLM's own benchmark client counts it a gap).
                yield chunk(state, text, state.finish, logprobs)
                wrote = True
            elif state.finish is not None:
                yield chunk(state, None, state.finish)  # nothing left to say but the end
                wrote = True
            if wrote:
                if delivery.gone():
                    # Dropped: the connection was lost (the client left, or the send
                    # deadline let it go) while this chunk waited to be written.
                    return
                # Resumed once uvicorn's send returned: the chunk is in the kernel, at
                # most ``SEND_AHEAD_BYTES`` unsent ahead of it (``send_ahead``), the
                # closest the server sees to its client having it (the client's own
                # receive buffer and reads it cannot see).
                written_at = delivery.clock()
                state.hand_out(written_at)
                if state.handed:
                    delivery.first_output(state, written_at)
                if state.finish is not None:
                    delivery.last_output(state)  # its finish_reason chunk: its last
        if prep.include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(prep, states)})
    except (EngineDeadError, EngineDrainingError) as exc:
        err = engine_error(exc)
        yield _sse(error_body(err.status, err.message, code=err.code))
    finally:
        delivery.close()
    yield "data: [DONE]\n\n"
