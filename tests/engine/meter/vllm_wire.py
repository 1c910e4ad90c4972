"""The SSE bytes vLLM v0.11's OpenAI server writes for a streamed request, case by case.

Written from vLLM v0.11's source (github vllm-project/vllm), not copied from it:

- ``vllm/entrypoints/openai/serving_chat.py``, ``chat_completion_stream_generator``: per
  choice a first chunk whose delta is ``{"role": ..., "content": ""}``, then a chunk per
  engine output (``model_dump_json(exclude_unset=True)``: only the fields it set, so
  ``logprobs``, ``finish_reason`` and ``token_ids`` as null); the finish chunk carries
  ``stop_reason``; with ``stream_options.include_usage`` a last chunk with
  ``"choices": []`` and the usage (``exclude_none``); with ``continuous_usage_stats``
  every chunk's ``usage`` counts its own choice's tokens so far; with ``echo`` (a vLLM
  extension) and a last message of the answer's role, one chunk per choice after the
  role chunks with that message's content, before any engine output; an exception anywhere
  is one ``data: {"error": {...}}`` event, then ``[DONE]`` all the same.
- ``vllm/entrypoints/openai/serving_completion.py``, ``create_completion``: a request
  with ``use_beam_search``, or a ``best_of`` given other than ``n``, is not streamed
  (lines 242-247) but answered whole, as one event, its usage filled (300-308).
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


def chat_echo(content: str, index: int = 0, *, model: str = "llama",
              usage: tuple[int, int] | None = None) -> bytes:
    """With ``"echo": true`` where the last message is the answer's role's (an assistant
    message to continue), the chunk after the role chunks: that message's content sent
    back before any generated token (``DeltaMessage(content=last_msg_content)``, no
    ``token_ids`` set, so none written); its continuous usage counts 0 tokens."""
    chunk: dict[str, Any] = {
        "id": "chatcmpl-7", "object": "chat.completion.chunk", "created": CREATED,
        "model": model, "choices": [{"index": index, "delta": {"content": content},
                                     "logprobs": None, "finish_reason": None}]}
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
    """A completions chunk, every field written: its continuous usage's
    ``prompt_tokens_details`` too, as null."""
    return _sse(_compact({
        "id": "cmpl-7", "object": "text_completion", "created": CREATED, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs,
                     "finish_reason": finish, "stop_reason": None,
                     "prompt_token_ids": None, "token_ids": None}],
        "usage": None if usage is None else {**_usage(*usage),
                                             "prompt_tokens_details": None}}))


def completion_usage(prompt: int, completion_tokens: int, *, model: str = "llama") -> bytes:
    return _sse(_compact({"id": "cmpl-7", "object": "text_completion", "created": CREATED,
                          "model": model, "choices": [],
                          "usage": _usage(prompt, completion_tokens)}))


def completion_whole(text: str, prompt: int, completion_tokens: int, *,
                     finish: str = "length", model: str = "llama") -> bytes:
    """The one event of a completions stream vLLM does not stream
    (``serving_completion.py``: ``stream`` with ``use_beam_search``, or a ``best_of``
    other than ``n``): the whole ``CompletionResponse.model_dump_json()``, every field
    and the usage, whatever ``stream_options`` said; then ``[DONE]``."""
    return _sse(_compact({
        "id": "cmpl-7", "object": "text_completion", "created": CREATED, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                     "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                     "prompt_token_ids": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {**_usage(prompt, completion_tokens), "prompt_tokens_details": None},
        "kv_transfer_params": None}))


def error(message: str) -> bytes:
    """The event an exception in the stream's generator becomes (then ``[DONE]``)."""
    return _sse(json.dumps({"error": {"message": message, "type": "BadRequestError",
                                      "param": None, "code": 400}}))


# The Responses API (``POST /v1/responses`` with ``"stream": true``), from vLLM v0.11's
# source, not copied from it:
#
# - ``vllm/entrypoints/openai/api_server.py``, ``_convert_stream_to_sse_events``: each
#   event is ``event: <its type>`` then ``data: <model_dump_json(indent=None)>`` (every
#   field, nulls included), in a ``StreamingResponse`` of ``text/event-stream``; no
#   ``[DONE]``, and an exception in the generator writes nothing: the stream breaks off.
# - ``vllm/entrypoints/openai/serving_responses.py``, ``responses_stream_generator``:
#   ``response.created`` and ``response.in_progress`` (the response so far, status
#   ``in_progress``), the events of ``_process_simple_streaming_events`` (or, for
#   gpt-oss, ``_process_harmony_streaming_events``), then ``response.completed`` with
#   the whole response (``responses_full_generator``) and its usage, numbered from 0 in
#   ``sequence_number``. Its status is ``incomplete`` (``incomplete_details.reason``
#   ``max_output_tokens``, ``ResponsesResponse.from_request``) where a gpt-oss answer
#   hit its limit: vLLM writes no ``response.incomplete`` event of its own.
# - ``_process_simple_streaming_events``: before the first delta an
#   ``output_item.added`` (a reasoning item or a message) and a ``content_part.added``;
#   one ``response.reasoning_text.delta`` or ``response.output_text.delta`` per engine
#   output (the latter's ``logprobs`` one entry a token where the request ``include``s
#   ``message.output_text.logprobs``, else ``[]``); the ``.done`` events at the end.
# - ``_process_harmony_streaming_events``: a function call's first argument delta is
#   written as the ``output_item.added`` of a ``function_call`` item (its name), the
#   next ones as ``response.function_call_arguments.delta``.
# - The events' and the response's fields in the order their pydantic models declare
#   them (openai-python's ``openai.types.responses``, vLLM's ``protocol.ResponsesResponse``).
#   ``response.incomplete``, ``response.failed`` and ``error`` are the OpenAI API's
#   events (openai-python's ``ResponseIncompleteEvent``, ``ResponseFailedEvent``,
#   ``ResponseErrorEvent``) that other servers, and later vLLMs, write.

def _named(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {_compact(payload)}\n\n".encode()


class ResponsesStream:
    """One Responses stream's events, numbered as vLLM numbers them (``sequence_number``
    from 0, ``_increment_sequence_number_and_return``)."""

    def __init__(self, *, model: str = "llama", max_output_tokens: int = 8) -> None:
        self.model, self.max_output_tokens = model, max_output_tokens
        self.seq = 0
        self.item = "msg_7"

    def _event(self, kind: str, **fields: Any) -> bytes:
        # openai-python's event models declare their fields in alphabetical order
        # (``sequence_number`` and ``type`` among them).
        fields |= {"sequence_number": self.seq, "type": kind}
        payload = {k: fields[k] for k in sorted(fields)}
        self.seq += 1
        return _named(payload)

    def _response(self, status: str, *, output: list[Any] | None = None,
                  usage: tuple[int, int] | None = None,
                  incomplete: str | None = None) -> dict[str, Any]:
        return {
            "id": "resp_7", "created_at": CREATED,
            "incomplete_details": None if incomplete is None else {"reason": incomplete},
            "instructions": None, "metadata": None, "model": self.model, "object": "response",
            "output": output or [], "parallel_tool_calls": True, "temperature": 1.0,
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "background": False,
            "max_output_tokens": self.max_output_tokens, "max_tool_calls": None,
            "previous_response_id": None, "prompt": None, "reasoning": None,
            "service_tier": "auto", "status": status, "text": None, "top_logprobs": None,
            "truncation": "disabled",
            "usage": None if usage is None else {
                "input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": usage[1],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage[0] + usage[1]},
            "user": None, "input_messages": None, "output_messages": None}

    def created(self) -> bytes:
        """``response.created`` then ``response.in_progress``: no token yet."""
        return (self._event("response.created", response=self._response("in_progress"))
                + self._event("response.in_progress",
                              response=self._response("in_progress")))

    def message_added(self, *, reasoning: bool = False) -> bytes:
        """The item and content part written before the first delta: no token."""
        item: dict[str, Any] = (
            {"id": self.item, "summary": [], "type": "reasoning", "content": None,
             "encrypted_content": None, "status": "in_progress"} if reasoning else
            {"id": self.item, "content": [], "role": "assistant", "status": "in_progress",
             "type": "message"})
        return (self._event("response.output_item.added", item=item, output_index=0)
                + self._event("response.content_part.added", content_index=0,
                              item_id=self.item, output_index=0,
                              part={"annotations": [], "text": "", "type": "output_text",
                                    "logprobs": []}))

    def text(self, delta: str, *, logprobs: list[Any] | None = None) -> bytes:
        return self._event("response.output_text.delta", content_index=1, delta=delta,
                           item_id=self.item, logprobs=logprobs or [], output_index=0)

    def reasoning(self, delta: str) -> bytes:
        return self._event("response.reasoning_text.delta", content_index=1, delta=delta,
                           item_id=self.item, output_index=0)

    def function_call_added(self, name: str) -> bytes:
        """gpt-oss: a function call's first argument delta, written as its item."""
        return self._event("response.output_item.added", item={
            "arguments": "", "call_id": "call_7", "name": name, "type": "function_call",
            "id": self.item, "status": "in_progress"}, output_index=0)

    def arguments(self, delta: str) -> bytes:
        return self._event("response.function_call_arguments.delta", delta=delta,
                           item_id="fc_7", output_index=0)

    def text_done(self, text: str) -> bytes:
        return self._event("response.output_text.done", content_index=2, item_id=self.item,
                           logprobs=[], output_index=0, text=text)

    def completed(self, output_tokens: int, *, status: str = "completed",
                  prompt_tokens: int = 5) -> bytes:
        """The last event: the whole response and its usage (``status`` ``incomplete``
        where a gpt-oss answer hit ``max_output_tokens``)."""
        return self._event("response.completed", response=self._response(
            status, usage=(prompt_tokens, output_tokens),
            incomplete="max_output_tokens" if status == "incomplete" else None))

    def incomplete(self, output_tokens: int, reason: str = "max_output_tokens") -> bytes:
        return self._event("response.incomplete", response=self._response(
            "incomplete", usage=(5, output_tokens), incomplete=reason))

    def failed(self) -> bytes:
        return self._event("response.failed", response=self._response("failed") | {
            "error": {"code": "server_error", "message": "EngineCore encountered an issue."}})

    def error(self, message: str) -> bytes:
        return self._event("error", code="server_error", message=message, param=None)
