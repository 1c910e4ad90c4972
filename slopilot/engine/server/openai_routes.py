"""The inference routes: OpenAI completions and chat, models, health, metrics.

The OpenAPI document says what each route really answers: JSON or an SSE stream for the
generation routes, Prometheus text for /metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from slopilot.engine.scheduler import DisplacedError
from slopilot.engine.server.arrival import arrival_of
from slopilot.engine.server.async_engine import DrainedError
from slopilot.engine.server.client_gate import GrantRefusal, grants_of
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from slopilot.engine.server.response_models import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from slopilot.engine.server.responses import (
    DeliveredJSON,
    DeliveredStream,
    Delivery,
    collect,
    engine_error,
)
from slopilot.engine.server.serving import (
    INLINE_PREPARE_CHARS,
    PRIORITY_HEADER,
    model_not_found,
    one_priority_header,
    prepare,
    refused_for_load,
    submit,
    text_size,
)
from slopilot.engine.server.state import ServerState

T = TypeVar("T")
_SSE = {"text/event-stream": {"schema": {
    "type": "string", "description": "With stream=true: `data: {chunk JSON}` events, "
    "one per delta (each naming its choice index), then `data: [DONE]`"}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    200: {"content": _SSE},
    **{status: {"model": ErrorResponse, "description": desc} for status, desc in (
        (400, "Bad input (code context_length_exceeded: the prompt or max_tokens does "
         "not fit the context)"),
        (401, "With client grants (--clients): no granted API key (code invalid_api_key)"),
        (403, "With client grants: a class above the key's grant (code "
         "priority_not_allowed)"), (404, "Unknown model"),
        (429, "Waiting queue full (see Retry-After), or a request not yet started gave "
         "way in it to a more urgent class (code queue_full)"), (500, "The engine failed"),
        (503, "Draining: refused, or ended by the drain's timeout before any choice "
         "started (code draining)"))}}


_NO_KEY: dict[str, Any] = {"model": ErrorResponse, "description": "With client grants "
                           "(--clients): no granted API key (code invalid_api_key)"}


class PrometheusText(Response):
    """The classic exposition format: the OpenMetrics encoder would rename vllm:*."""

    media_type = CONTENT_TYPE_PLAIN_0_0_4


async def _client_gone(request: Request) -> None:
    # The body is already read, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work``; if the client disconnects first, cancel it (its cleanup aborts)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def add_routes(app: FastAPI, state: ServerState) -> None:
    backend, engine = state.backend, state.engine
    clock = backend.engine.clock.now

    async def generate(body: CompletionRequest | ChatCompletionRequest,
                       request: Request) -> Response:
        arrival = arrival_of(request, clock)
        # Taken now: an SLO replaced while the request is tokenized or waits for the
        # engine thread to admit it (a whole iteration) is for the requests after it.
        slo = backend.metrics.slo
        clients = grants_of(request.scope)
        one_priority_header(request.headers.getlist(PRIORITY_HEADER))
        try:
            if text_size(body) < INLINE_PREPARE_CHARS:
                prep = prepare(backend, body, request.headers, arrival, clients)
            else:
                # Tokenizing a long prompt or rendering its chat template takes real time:
                # off the event loop, so every other stream keeps flowing meanwhile.
                prep = await asyncio.get_running_loop().run_in_executor(
                    state.tokenize, prepare, backend, body, request.headers, arrival,
                    clients)
        except GrantRefusal as exc:
            if state.clients is not None:
                state.clients.counts.count_refused(exc.client, exc.reason)
            raise
        if prep.served is not None and state.clients is not None:
            state.clients.counts.count_served(prep.served.client, prep.served.priority)
        streams = await submit(engine, prep, backend.metrics, slo)
        delivery = Delivery(backend, prep, streams, clock, slo=slo)
        result: dict[str, object] | bool | None
        try:
            if prep.stream:
                # The stream's status goes out with its first output, not at admission:
                # until a choice starts, a full queue may displace them for a more urgent
                # request (queue_room.py), or a drain end them, and its client is then
                # owed a 429 or a 503, not a 200.
                result = await _unless_disconnected(request, delivery.started())
            else:
                result = await _unless_disconnected(request,
                                                    collect(delivery, state.text_of))
        except DisplacedError as exc:
            delivery.refused()
            raise refused_for_load(engine, prep, backend.metrics, slo, exc) from None
        except DrainedError as exc:
            # A drain ended it before any choice started: the 503 of the door, so its
            # client retries on another replica (a 200 with no text it would not).
            delivery.refused()
            raise engine_error(exc) from None
        except BaseException:
            delivery.close()
            raise
        if result is None:  # nobody is listening; the request was aborted
            delivery.close()
            return Response(status_code=499)
        if isinstance(result, dict):
            return DeliveredJSON(result, delivery)
        return DeliveredStream(delivery, state.text_of)

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generate(body, request)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generate(body, request)

    def card() -> ModelCard:
        return ModelCard(id=backend.served_model_name, created=state.started_at,
                         max_model_len=backend.max_model_len)

    @app.get("/v1/models", response_model=ModelList, responses={401: _NO_KEY})
    async def models() -> ModelList:
        return ModelList(data=[card()])

    # ``:path``: a served name may hold a slash (a Hub name, as vLLM serves by default),
    # and the openai SDK's models.retrieve puts it in the path as it is.
    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses={
        401: _NO_KEY, 404: {"model": ErrorResponse, "description": "Not the model served "
                            "here (code model_not_found)"}})
    async def model_card(model: str) -> ModelCard:
        if model != backend.served_model_name:
            raise model_not_found(backend, model)
        return card()

    @app.get("/health", responses={
        500: {"description": "The engine loop failed"}, 503: {"description": "Draining"}})
    async def health() -> JSONResponse:
        if engine.error is not None:
            return JSONResponse({"status": "failed",
                                 "error": type(engine.error).__name__}, 500)
        if engine.draining or not engine.is_running:
            return JSONResponse({"status": "draining"}, 503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", response_class=PrometheusText)
    async def metrics() -> Response:
        return PrometheusText(backend.metrics.render())
