"""Fields other OpenAI-compatible servers honour and this one cannot are refused when
they ask for something, never dropped in silence.

The request models ignore unknown fields, so these were ignored too: a client asking
vLLM's guided_json for JSON, OpenAI's legacy functions, or min_p got an answer made
without them, a 200, and no word. A value that asks for nothing (the field's default)
passes: clients that write every field send those.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.live_server import LiveServer
from tests.support.waits import HANG_GUARD_S

COMPLETION = {"prompt": "hi", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _post(srv: LiveServer, chat: bool, extra: dict[str, Any]) -> httpx.Response:
    path, base = ("/v1/chat/completions", CHAT) if chat else ("/v1/completions", COMPLETION)
    return httpx.post(srv.url + path, json={**base, **extra}, timeout=HANG_GUARD_S)


@pytest.mark.parametrize(("chat", "extra"), [
    (False, {"min_p": 0.5}),
    (False, {"guided_json": {"type": "object"}}),
    (False, {"guided_choice": ["yes", "no"]}),
    (False, {"response_format": {"type": "json_object"}}),
    (False, {"include_stop_str_in_output": True}),
    (False, {"use_beam_search": True}),
    (False, {"allowed_token_ids": [1, 2]}),
    (False, {"prompt_logprobs": 1}),
    (True, {"functions": [{"name": "f", "parameters": {}}]}),
    (True, {"tool_choice": "required"}),
    (True, {"guided_regex": "[ab]+"}),
    (True, {"skip_special_tokens": False}),
])
def test_a_field_this_server_cannot_honour_is_a_400_naming_it(
        sim_server: LiveServer, chat: bool, extra: dict[str, Any]) -> None:
    res = _post(sim_server, chat, extra)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    (name,) = extra
    assert err["param"] == name and err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"{name}: ") and "leave it out" in err["message"]


@pytest.mark.parametrize(("chat", "extra"), [
    (False, {"min_p": 0}),
    (False, {"guided_json": None}),
    (False, {"response_format": {"type": "text"}}),
    (False, {"skip_special_tokens": True, "add_special_tokens": True}),
    (False, {"bad_words": []}),
    (True, {"tool_choice": "none"}),
    (True, {"add_generation_prompt": True, "continue_final_message": False}),
    (True, {"chat_template_kwargs": {}}),
    (True, {"parallel_tool_calls": False}),
])
def test_a_default_value_of_such_a_field_asks_for_nothing_and_is_served(
        sim_server: LiveServer, chat: bool, extra: dict[str, Any]) -> None:
    res = _post(sim_server, chat, extra)
    assert res.status_code == 200, res.text


@pytest.mark.parametrize("extra", [
    {"add_generation_prompt": False},
    {"add_generation_prompt": False, "continue_final_message": True},
    {"chat_template_kwargs": {"enable_thinking": False}},
])
def test_what_the_chat_template_is_rendered_with_is_honoured(
        sim_server: LiveServer, extra: dict[str, Any]) -> None:
    """vLLM's rendering fields: the template's own switches (Qwen3's ``enable_thinking``),
    no generation prompt, a final message continued (tests/engine/test_chat_template.py
    has what each renders)."""
    res = _post(sim_server, True, extra)
    assert res.status_code == 200, res.text


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"continue_final_message": True}, "continue_final_message",
     "set add_generation_prompt to false"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
     "chat_template_kwargs.messages"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs",
     "valid dictionary"),
])
def test_a_rendering_that_cannot_be_is_a_400_naming_its_field(
        sim_server: LiveServer, extra: dict[str, Any], param: str, words: str) -> None:
    res = _post(sim_server, True, extra)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["param"] == param and words in err["message"], err
