"""A field sent as JSON null means its default, as the OpenAI API (which marks these
fields nullable) and vLLM read it: clients that write every field, set or not, send
``"n": null`` or ``"stream": null``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.live_server import LiveServer
from tests.support.waits import HANG_GUARD_S

_COMMON = ["n", "stream", "presence_penalty", "frequency_penalty", "ignore_eos",
           "min_tokens", "repetition_penalty", "return_token_ids"]


def _post(srv: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("field", [*_COMMON, "echo"])
def test_a_null_completions_field_is_its_default(sim_server: LiveServer, field: str) -> None:
    res = _post(sim_server, "/v1/completions", {"prompt": "a b", "max_tokens": 2, field: None})
    assert res.status_code == 200, res.text
    body = res.json()
    assert len(body["choices"]) == 1 and body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("field", [*_COMMON, "logprobs"])
def test_a_null_chat_field_is_its_default(sim_server: LiveServer, field: str) -> None:
    res = _post(sim_server, "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2,
                 field: None})
    assert res.status_code == 200, res.text
    choice = res.json()["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["logprobs"] is None


def test_a_null_include_usage_asks_for_none(sim_server: LiveServer) -> None:
    """Not its default (true once the options are given): vLLM tests the value, and
    null is false there. Its completions chunks write ``"usage": null`` all the same."""
    with httpx.stream("POST", sim_server.url + "/v1/completions", timeout=HANG_GUARD_S,
                      json={"prompt": "a b", "max_tokens": 2, "stream": True,
                            "stream_options": {"include_usage": None}}) as res:
        assert res.status_code == 200, res.read()
        lines = [line for line in res.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["usage"] is None for line in lines[:-1])


def test_a_null_required_field_is_still_refused(sim_server: LiveServer) -> None:
    res = _post(sim_server, "/v1/completions", {"prompt": None})
    assert res.status_code == 400 and res.json()["error"]["param"] == "prompt"
