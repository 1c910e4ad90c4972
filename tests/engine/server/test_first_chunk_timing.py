"""A stream's first chunk goes out with its first token, as vLLM's does.

``vllm bench serve`` (``async_request_openai_chat_completions``) takes a stream's TTFT
at its first SSE message with ``choices``, whatever the delta says, and one ITL at each
later one. vLLM writes a chat stream's role chunk (``{"role": "assistant", "content":
""}``) on the first output of its engine (``serving_chat.py``: ``if first_iteration``),
so that client's TTFT is the first token's. A role chunk written before any token reads,
to it, as a first token come at once, and the time to the real one as a gap.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from slopilot.engine.request import FinishReason
from slopilot.engine.server.backends import Backend
from tests.support.live_server import build_backend
from tests.support.scripted_stream import stamped

LENGTH = FinishReason.LENGTH
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 3,
                        "stream": True, "stream_options": {"include_usage": True}}
COMPLETION: dict[str, Any] = {"prompt": "a b", "max_tokens": 3, "stream": True,
                              "stream_options": {"include_usage": True}}
# The engine makes nothing for a while (a queue, a long prefill), then the tokens.
STEPS: list[list[Any]] = [[], [], [(0, 1)], [(0, 1)], [(0, 1, LENGTH)]]


@pytest.fixture(scope="module")
def backend() -> Backend:
    return build_backend(realtime=False)


def _with_choices(events: list[tuple[int, str]]) -> list[tuple[int, dict[str, Any]]]:
    """(step, choice) of each event with choices, as vLLM's benchmark client picks them."""
    out = []
    for step, event in events:
        body = event.removeprefix("data: ").strip()
        if body != "[DONE]" and (choices := json.loads(body).get("choices")):
            out.append((step, choices[0]))
    return out


@pytest.mark.parametrize("body", [CHAT, COMPLETION], ids=["chat", "completions"])
def test_vllm_bench_reads_the_first_token_as_the_first_chunk(
        backend: Backend, body: dict[str, Any]) -> None:
    """No chunk with choices goes out before the engine made a token (step 3 here): the
    TTFT that ``vllm bench serve`` reads is the server's, and no gap it reads spans the
    wait for the first token."""
    events = stamped(backend, body, STEPS)
    seen = _with_choices(events)
    assert [step for step, _ in seen][:1] == [3]
    assert [step for step, _ in seen] == sorted(step for step, _ in seen)
    if "messages" in body:
        assert seen[0][1]["delta"] == {"role": "assistant", "content": ""}
        assert seen[1][0] == 3 and seen[1][1]["delta"] == {"content": " tok"}
    assert events[-1] == (5, "data: [DONE]\n\n")


def test_every_choices_role_chunk_leads_the_first_token(backend: Backend) -> None:
    """With ``n`` choices, the first output (of any choice) brings every choice's role
    chunk first, as vLLM writes them, then its tokens."""
    events = stamped(backend, {**CHAT, "n": 2},
                     [[], [(1, 2)], [(0, 1), (1, 1, LENGTH)], [(0, 2, LENGTH)]])
    seen = _with_choices(events)
    assert [(step, c["index"], c["delta"]) for step, c in seen[:3]] == [
        (2, 0, {"role": "assistant", "content": ""}),
        (2, 1, {"role": "assistant", "content": ""}),
        (2, 1, {"content": " tok tok"})]
    assert all(step >= 2 for step, _ in events)
