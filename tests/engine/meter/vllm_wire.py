"""The SSE bytes vLLM v0.11's OpenAI server writes for a streamed request, case by case.

Written from vLLM v0.11's source (github vllm-project/vllm), not copied from it:

- ``vllm/entrypoints/openai/serving_chat.py``, ``chat_completion_stream_generator``: per
  choice a first chunk whose delta is ``{"role": ..., "content": ""}``, then a chunk per
  engine output (``model_dump_json(exclude_unset=True)``: only the fields it set, so
  ``logprobs``, ``finish_reason`` and ``token_ids`` as null); the finish chunk carries
  ``stop_reason``; with ``stream_options.include_usage`` a last chunk with
  ``"choices": []`` and the usage (``exclude_none``); with ``continuous_usage_stats``
  every chunk's ``usage`` counts its own choice's tokens so far; an exception anywhere
  is one ``data: {"error": {...}}`` event, then ``[DONE]`` all the same.
- ``vllm/entrypoints/openai/serving_completion.py``, ``completion_stream_generator``:
  every field written (``exclude_unset=False``, ``"usage": null`` included); a choice's
  index is ``output.index + prompt_idx * n`` for a list of prompts; a request aborted
  in the engine (``finish_reason == "abort"``) raises, and so ends in the error event.
- ``vllm/entrypoints/openai/serving_engine.py``, ``create_streaming_error_response``:
  ``json.dumps`` of ``ErrorResponse(error=ErrorInfo(...)).model_dump()`` (so with
  ``json.dumps``' spaces), code 400 whatever the cause.
- ``vllm/entrypoints/openai/api_server.py``: each stream is a ``StreamingResponse`` of
  ``media_type="text/event-stream"`` (``text/event-stream; charset=utf-8``).
"""

from __future__ import annotations

import json
from typing import Any

CONTENT_TYPE = "text/event-stream; charset=utf-8"
DONE = b"data: [DONE]\n\n"
CREATED = 1767225600


def _sse(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


def _compact(obj: dict[str, Any]) -> str:
    # pydantic's model_dump_json: no spaces, fields in declaration order.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _usage(prompt: int, completion: int) -> dict[str, int]:
    # UsageInfo's field order: prompt_tokens, total_tokens, completion_tokens.
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}


def chat_role(index: int = 0, *, model: str = "llama",
              usage: tuple[int, int] | None = None) -> bytes:
    """A choice's first chunk: its role and empty content, no token."""
    chunk: dict[str, Any] = {
        "id": "chatcmpl-7", "object": "chat.completion.chunk", "created": CREATED,
        "model": model, "choices": [{"index": index, "delta": {"role": "assistant",
                                                                "content": ""},
                                     "logprobs": None, "finish_reason": None}],
        "prompt_token_ids": None}
    if usage is not None:
        chunk["usage"] = _usage(*usage)
    return _sse(_compact(chunk))


def chat_delta(index: int = 0, *, finish: str | None = None, model: str = "llama",
               logprobs: Any = None, usage: tuple[int, int] | None = None,
               **delta: Any) -> bytes:
    """A chunk of one engine output: ``delta`` as the parsers made it (``content``,
    ``reasoning_content``, ``tool_calls``; empty for a finish with nothing left)."""
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                              "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = None
    chunk: dict[str, Any] = {"id": "chatcmpl-7", "object": "chat.completion.chunk",
                             "created": CREATED, "model": model, "choices": [choice]}
    if usage is not None:
        chunk["usage"] = _usage(*usage)
    return _sse(_compact(chunk))


def chat_usage(prompt: int, completion: int, *, model: str = "llama") -> bytes:
    """The last chunk with ``stream_options.include_usage``: no choices."""
    return _sse(_compact({"id": "chatcmpl-7", "object": "chat.completion.chunk",
                          "created": CREATED, "model": model, "choices": [],
                          "usage": _usage(prompt, completion)}))


def completion(index: int = 0, text: str = "", *, finish: str | None = None,
               model: str = "llama", logprobs: Any = None,
               usage: tuple[int, int] | None = None) -> bytes:
    """A completions chunk, every field written."""
    return _sse(_compact({
        "id": "cmpl-7", "object": "text_completion", "created": CREATED, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs,
                     "finish_reason": finish, "stop_reason": None,
                     "prompt_token_ids": None, "token_ids": None}],
        "usage": None if usage is None else _usage(*usage)}))


def completion_usage(prompt: int, completion_tokens: int, *, model: str = "llama") -> bytes:
    return _sse(_compact({"id": "cmpl-7", "object": "text_completion", "created": CREATED,
                          "model": model, "choices": [],
                          "usage": _usage(prompt, completion_tokens)}))


def error(message: str) -> bytes:
    """The event an exception in the stream's generator becomes (then ``[DONE]``)."""
    return _sse(json.dumps({"error": {"message": message, "type": "BadRequestError",
                                      "param": None, "code": 400}}))
