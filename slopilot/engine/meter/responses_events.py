"""One event of a Responses API stream (``POST /v1/responses``, ``"stream": true``), read
for the stream's judge: the tokens it brings, and whether it ends the answer.

vLLM v0.11 writes each event as ``event: <type>`` and ``data: <the event as JSON>``, the
JSON naming its type again (``api_server._convert_stream_to_sse_events``), and no
``[DONE]``: the stream ends with ``response.completed`` (``serving_responses.
responses_stream_generator``). Its output comes as deltas, one an engine output: text
(``response.output_text.delta``), reasoning (``response.reasoning_text.delta``), a
function call's arguments (``response.function_call_arguments.delta``) or a tool's code;
the OpenAI API adds reasoning summaries and refusals, each a ``...delta`` event too. The
events around them (``response.created``, ``...added``, ``...done``) carry no token.
"""

from __future__ import annotations

import enum
from typing import Any


class Ending(enum.StrEnum):
    """How an answer's last event ended it."""

    FINISHED = "finished"
    """The engine's own end (complete, or at its token limit): judged."""
    FAILED = "failed"
    """Failed or aborted unfinished: judged as cut short."""


def output_tokens(event: dict[str, Any], kind: str) -> int:
    """The tokens an event of type ``kind`` brings (0: none). A delta is one engine output,
    a token, unless its logprobs (one entry a token, ``include``
    ``message.output_text.logprobs``: ``serving_responses._create_stream_response_logprobs``)
    say how many vLLM merged into it. A ``function_call`` item announced is the call's
    name, generated as a chat stream's first ``tool_calls`` delta is; on gpt-oss, vLLM
    writes the call's first argument delta as that announcement
    (``_process_harmony_streaming_events``)."""
    if kind.endswith(".delta"):
        if not (isinstance(delta := event.get("delta"), str) and delta):
            return 0
        logprobs = event.get("logprobs")
        return len(logprobs) if isinstance(logprobs, list) and logprobs else 1
    if kind == "response.output_item.added":
        item = event.get("item")
        return 1 if isinstance(item, dict) and item.get("type") == "function_call" else 0
    return 0


def ending(event: dict[str, Any], kind: str) -> Ending | None:
    """How an event ends the answer; None where it does not.

    ``response.completed`` is vLLM's last event whatever the answer's status: ``incomplete``
    where it hit ``max_output_tokens`` (``ResponsesResponse.from_request``), ``cancelled``
    where the engine aborted it. An answer stopped at its limit, or by a content filter,
    is the engine's end, as chat's finish reasons ``length`` and ``content_filter`` are;
    one failed, cancelled or incomplete for another reason was cut short."""
    if kind == "error" or kind == "response.failed":
        return Ending.FAILED
    if kind not in ("response.completed", "response.incomplete"):
        return None
    response = event.get("response")
    response = response if isinstance(response, dict) else {}
    status = response.get("status", "completed" if kind == "response.completed" else
                          "incomplete")
    if status == "completed":
        return Ending.FINISHED
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(reason, str) and reason in _LIMIT_REASONS:
            return Ending.FINISHED
    return Ending.FAILED


def usage_tokens(event: dict[str, Any]) -> int | None:
    """The answer's output tokens, where the event's response counts them (the last
    event's usage; None on the ones before)."""
    response = event.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    return tokens if type(tokens) is int else None


def model(event: dict[str, Any]) -> str | None:
    """The served model's name, as the event's response names it."""
    response = event.get("response")
    name = response.get("model") if isinstance(response, dict) else None
    return name if isinstance(name, str) else None


_LIMIT_REASONS = frozenset({"max_output_tokens", "content_filter"})
"""``incomplete_details.reason``s that are the engine's end of an answer (the OpenAI API's
two; vLLM v0.11 writes only the first)."""
