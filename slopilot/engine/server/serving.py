"""From a validated OpenAI request to engine tokens and back to OpenAI responses.

``prepare`` checks what only the server can check (token ids against the vocabulary,
the context length, the priority header) and builds the engine ``Request``;
``submit`` admits it, mapping the scheduler's refusals to HTTP statuses; ``collect``
and ``sse_events`` turn the request's token stream into one response or SSE chunks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from slopilot.engine.request import FinishReason, Priority, Request, SamplingParams
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from slopilot.engine.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineDrainingError,
    RequestStream,
)
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.detokenizer import IncrementalDetokenizer
from slopilot.engine.server.errors import APIError, error_body
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest

PRIORITY_HEADER = "x-slopilot-priority"
# The OpenAI completions default; chat defaults to whatever context is left.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass
class Prepared:
    request: Request
    stop: list[str]
    # Ids whose text is not part of the output when they end a request.
    stop_ids: frozenset[int]
    chat: bool
    include_usage: bool
    stream: bool
    return_token_ids: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def _priority(body_value: int | str | None, headers: Mapping[str, str]) -> Priority:
    raw = body_value if body_value is not None else headers.get(PRIORITY_HEADER)
    if raw is None:
        return Priority.P1
    try:
        return Priority.parse(raw)
    except ValueError as exc:
        param = "priority" if body_value is not None else PRIORITY_HEADER
        raise APIError(400, str(exc), param=param) from None


def _prompt_ids(backend: Backend, body: CompletionRequest | ChatCompletionRequest
                ) -> list[int]:
    tok = backend.tokenizer
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = tok.apply_chat_template(messages)
        except ValueError as exc:  # TokenizerError: no template, or it refused
            raise APIError(400, str(exc), param="messages") from None
        return tok.encode(text, add_special_tokens=False)
    prompt = body.prompt
    if isinstance(prompt, str):
        return tok.encode(prompt)
    vocab = tok.vocab_size
    bad = next((t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})",
                       param="prompt")
    return list(prompt)  # type: ignore[arg-type]


def prepare(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
            headers: Mapping[str, str]) -> Prepared:
    chat = isinstance(body, ChatCompletionRequest)
    if body.model is not None and body.model != backend.served_model_name:
        raise APIError(404, f"model {body.model!r} is not served here; this server serves "
                       f"{backend.served_model_name!r}", param="model",
                       code="model_not_found")
    priority = _priority(body.priority, headers)
    ids = _prompt_ids(backend, body)
    if not ids:
        raise APIError(400, "the prompt is empty (it encodes to no tokens)",
                       param="messages" if chat else "prompt")
    limit = backend.max_model_len
    if len(ids) >= limit:
        raise APIError(413, f"the prompt has {len(ids)} tokens; this model's context is "
                       f"{limit} tokens, which must also hold the output: shorten the prompt",
                       param="messages" if chat else "prompt", code="context_length_exceeded")
    asked = body.requested_max_tokens if isinstance(body, ChatCompletionRequest) \
        else body.max_tokens
    max_tokens = asked if asked is not None else (
        limit - len(ids) if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
    if len(ids) + max_tokens > limit:
        raise APIError(400, f"this model's context is {limit} tokens; the prompt has "
                       f"{len(ids)} and max_tokens asks for {max_tokens}: lower max_tokens "
                       f"to at most {limit - len(ids)}", param="max_tokens",
                       code="context_length_exceeded")
    user_stop_ids = tuple(body.stop_token_ids or ())
    eos = backend.eos_token_ids
    extra_eos = () if body.ignore_eos else tuple(eos[1:])
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    try:
        params = SamplingParams(
            max_tokens=max_tokens, min_tokens=body.min_tokens,
            stop_token_ids=user_stop_ids + extra_eos, ignore_eos=body.ignore_eos,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=top_k, top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    prefix = "chatcmpl" if chat else "cmpl"
    req = Request(f"{prefix}-{uuid.uuid4().hex}", ids, params, priority=priority,
                  eos_token_id=eos[0] if eos else None)
    return Prepared(req, body.stop_strings, frozenset(user_stop_ids) | frozenset(eos), chat,
                    body.include_usage, body.stream, body.return_token_ids)


async def submit(engine: AsyncEngine, prep: Prepared) -> RequestStream:
    try:
        return await engine.add_request(prep.request)
    except QueueFullError as exc:
        raise APIError(429, str(exc), code="queue_full",
                       headers={"Retry-After": str(engine.retry_after_s())}) from None
    except PromptTooLongError as exc:
        raise APIError(413, str(exc), code="context_length_exceeded") from None
    except EngineDrainingError as exc:
        raise APIError(503, str(exc), code="draining") from None
    except EngineDeadError as exc:
        raise APIError(500, str(exc), code="engine_dead") from None


class _Decoder:
    """Text and finish reason of one request, delta by delta."""

    def __init__(self, backend: Backend, prep: Prepared, stream: RequestStream) -> None:
        self.stream = stream
        self.stop_ids = prep.stop_ids
        self.detok = IncrementalDetokenizer(backend.tokenizer, prep.request.prompt_token_ids,
                                            prep.stop)
        self.token_ids: list[int] = []
        self.finish: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def feed(self, token_ids: list[int], finish: FinishReason | None) -> str:
        self.token_ids += token_ids
        if finish is FinishReason.STOP and token_ids and token_ids[-1] in self.stop_ids:
            token_ids = token_ids[:-1]  # the stop token itself is not output text
        self.detok.add(token_ids, final=finish is not None)
        if self.detok.stopped:
            self.finish = FinishReason.STOP.value
            self.stream.abort(stopped=True)  # a stop string: the engine need not go on
        elif finish is not None:
            self.finish = finish.value
        return self.detok.take(final=self.finish is not None)

    def usage(self, prompt_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": self.num_tokens,
                "total_tokens": prompt_tokens + self.num_tokens}


async def collect(backend: Backend, prep: Prepared, stream: RequestStream
                  ) -> dict[str, object]:
    """Run the request to its end; the whole OpenAI response body."""
    dec = _Decoder(backend, prep, stream)
    parts: list[str] = []
    try:
        async for delta in stream:
            parts.append(dec.feed(delta.token_ids, delta.finish_reason))
            if dec.finish is not None:
                break
    except EngineDeadError as exc:
        raise APIError(500, str(exc), code="engine_dead") from None
    except EngineDrainingError as exc:
        raise APIError(503, str(exc), code="draining") from None
    finally:
        stream.abort()  # a no-op once finished; else the handler was cancelled
    text = "".join(parts)
    req = prep.request
    usage = dec.usage(req.num_prompt_tokens)
    common: dict[str, object] = {"id": req.request_id, "created": prep.created,
                                 "model": backend.served_model_name, "usage": usage}
    choice: dict[str, object] = {"index": 0, "finish_reason": dec.finish, "logprobs": None}
    if prep.return_token_ids:
        common["prompt_token_ids"] = req.prompt_token_ids
        choice["token_ids"] = dec.token_ids
    if prep.chat:
        choice["message"] = {"role": "assistant", "content": text}
        return {**common, "object": "chat.completion", "choices": [choice]}
    choice["text"] = text
    return {**common, "object": "text_completion", "choices": [choice]}


def _sse(payload: object) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def sse_events(backend: Backend, prep: Prepared, stream: RequestStream
                     ) -> AsyncIterator[str]:
    """SSE ``data:`` chunks, then ``data: [DONE]``; a closed client aborts the request."""
    dec = _Decoder(backend, prep, stream)
    req = prep.request
    obj = "chat.completion.chunk" if prep.chat else "text_completion"
    base: dict[str, object] = {"id": req.request_id, "object": obj, "created": prep.created,
                               "model": backend.served_model_name}
    if prep.include_usage:
        base["usage"] = None

    def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
        if prep.chat:
            delta: dict[str, str] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, object] = {"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish}
        return _sse({**base, "choices": [choice]})

    try:
        if prep.chat:
            yield chunk("", None, first=True)
        async for delta in stream:
            text = dec.feed(delta.token_ids, delta.finish_reason)
            if dec.finish is not None:
                if text:
                    yield chunk(text, None)
                yield chunk(None, dec.finish)
                break
            if text:
                yield chunk(text, None)
        if prep.include_usage:
            yield _sse({**base, "choices": [], "usage": dec.usage(req.num_prompt_tokens)})
    except (EngineDeadError, EngineDrainingError) as exc:
        status = 500 if isinstance(exc, EngineDeadError) else 503
        yield _sse(error_body(status, str(exc)))
    finally:
        stream.abort()  # a no-op once finished; else the client went away
    yield "data: [DONE]\n\n"
