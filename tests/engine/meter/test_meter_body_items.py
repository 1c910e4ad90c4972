"""A body for generation of more JSON items than a request to vLLM's model can need is
refused by the meter (413) before it is forwarded, counted from its bytes as they arrive
with the server's ``JsonItems`` against the server's bound (``body_items``).

vLLM parses a body on its event loop (``json.loads`` and pydantic, holding the GIL): a
valid 16.5 MB body of one ignored field ``"x": [1]*5_500_000`` held every stream of the
engine for seconds. The bound follows the context vLLM's ``/v1/models`` says, learned at
the meter's startup; until then a generous default.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from slopilot.engine.meter.proxy import Meter
from tests.engine.meter.test_meter import DONE, Client, Upstream, counted, event, meter_for, run
from tests.support.waits import HANG_GUARD_S


class _Vllm(Upstream):
    """A stand-in vLLM whose ``/v1/models`` gives ``max_model_len``, as vLLM's model
    cards do; every other request as ``Upstream``'s."""

    def __init__(self, max_model_len: int) -> None:
        super().__init__()
        self.max_model_len = max_model_len
        self.model_asks = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            self.model_asks += 1
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "llama", "object": "model", "owned_by": "vllm", "root": "llama",
                 "parent": None, "max_model_len": self.max_model_len}]})
        return await super().handle(request)


def _ignored(items: int) -> bytes:
    """A valid completions request with one field vLLM ignores, an array of ``items``."""
    return (b'{"model": "llama", "prompt": "hi", "max_tokens": 1, "stream": true, "x": ['
            + b"1," * (items - 1) + b"1]}")


async def _learned(meter: Meter, upstream: _Vllm) -> Callable[[], Awaitable[None]]:
    """The meter started (its lifespan), once it has learned the stand-in's context; what
    shuts it down."""
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await messages.put({"type": "lifespan.startup"})

    async def ignore(message: Any) -> None:
        pass

    life = asyncio.ensure_future(meter({"type": "lifespan"}, messages.get, ignore))

    context = getattr(meter, "model_context", None)
    assert context is not None, "the meter learns no context from vLLM"

    async def learned() -> None:
        while context.max_model_len != upstream.max_model_len:
            await asyncio.sleep(0)
    await asyncio.wait_for(learned(), HANG_GUARD_S)

    async def stop() -> None:
        await messages.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(life, HANG_GUARD_S)
    return stop


def test_a_body_of_millions_of_ignored_items_is_413_and_never_forwarded(
        tmp_path: Path) -> None:
    """11 MB, within the byte cap: before the context is learned, refused against the
    default's bound; never reaches vLLM, and counted nowhere (as the meter's other 413)."""
    upstream = _Vllm(4096)
    now = [0.0]
    meter = meter_for(tmp_path, upstream, now)

    async def go() -> tuple[int, dict[str, str], bytes]:
        return await Client(meter, now).request("POST", "/v1/completions",
                                                raw=_ignored(5_500_000))

    status, _, body = run(go)
    assert status == 413
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large"
    assert "2,686,976 JSON values" in error["message"]
    assert "131,072-token context" in error["message"]
    assert "262,144-token vocabulary" in error["message"]
    assert upstream.requests == []
    assert (meter.arrivals, meter.invalid, meter.refused, counted(meter)) == (0, 0, 0, {})


def _at_the_limits(max_model_len: int, vocab: int) -> bytes:
    """What the bound is made for: a full batch of token-id prompts filling the context,
    and a logit_bias and stop_token_ids over the whole vocabulary."""
    return json.dumps({
        "model": "llama", "max_tokens": 1, "stream": True,
        "prompt": [[7] * (max_model_len - 1)] * 16,
        "logit_bias": {str(t): 0 for t in range(vocab)},
        "stop_token_ids": list(range(vocab))}).encode()


def test_a_body_at_the_deployments_limits_is_forwarded(tmp_path: Path) -> None:
    upstream = _Vllm(4096)
    now = [0.0]
    meter = meter_for(tmp_path, upstream, now)
    upstream.answer([event(text="a", finish="stop"), DONE])
    body = _at_the_limits(4096, 262_144)

    async def go() -> int:
        life = await _learned(meter, upstream)
        status, _, _ = await Client(meter, now).request(
            "POST", "/v1/completions", raw=body, written_at=[0.1, 0.1])
        await life()
        return status

    assert run(go) == 200
    assert len(upstream.requests) == 1
    assert meter.arrivals == 16


def _chat_of_a_million_items(tmp_path: Path, upstream: _Vllm, **kw: Any
                             ) -> tuple[Meter, int, dict[str, str], bytes]:
    """A meter (``kw``: its own arguments) started over ``upstream``, asked for a chat
    completion of 1,000,000 ignored items once it knows the context; its answer."""
    now = [0.0]
    meter = meter_for(tmp_path, upstream, now, **kw)
    upstream.answer([event(text="a", finish="stop"), DONE])

    async def go() -> tuple[int, dict[str, str], bytes]:
        life = await _learned(meter, upstream)
        got = await Client(meter, now).request(
            "POST", "/v1/chat/completions", raw=_ignored(1_000_000), written_at=[0.1, 0.1])
        await life()
        return got

    status, headers, body = run(go)
    return meter, status, headers, body


@pytest.mark.parametrize(("max_model_len", "status"), [(4096, 413), (32_768, 200)])
def test_the_bound_follows_the_context_vllm_gives(tmp_path: Path, max_model_len: int,
                                                  status: int) -> None:
    """1,000,000 items: past 16 x 4,096 + 2 x 262,144 + 65,536 = 655,360, within
    16 x 32,768 + ... = 1,114,112; both well within the default's bound."""
    upstream = _Vllm(max_model_len)
    meter, got, _, body = _chat_of_a_million_items(tmp_path, upstream)
    assert got == status
    if status == 413:
        assert "655,360 JSON values" in json.loads(body)["error"]["message"]
        assert "4,096-token context" in json.loads(body)["error"]["message"]
        assert upstream.requests == [] and meter.arrivals == 0
    else:
        assert len(upstream.requests) == 1


def test_a_context_given_on_the_command_line_is_the_bound_and_vllm_is_not_asked(
        tmp_path: Path) -> None:
    """A vLLM run with ``--api-key`` answers the meter's ``/v1/models`` 401 (the meter
    holds no key), which left the 131,072-token default: ``--max-model-len`` states it,
    as vLLM's own flag does, and the meter asks nothing."""
    upstream = _Vllm(4096)
    _, status, _, body = _chat_of_a_million_items(tmp_path, upstream, max_model_len=4096)
    assert status == 413 and "4,096-token context" in json.loads(body)["error"]["message"]
    assert upstream.model_asks == 0 and upstream.requests == []


@pytest.mark.parametrize("given", ["0", "-5", "1.5", "many"])
def test_a_context_that_is_no_token_count_is_refused_naming_the_flag(
        given: str, capsys: pytest.CaptureFixture[str]) -> None:
    from slopilot.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["meter", "--upstream", "http://127.0.0.1:8001", "--slo-file", "slo.json",
              "--max-model-len", given])
    assert exit_.value.code == 2
    assert f"--max-model-len {given}" in (err := capsys.readouterr().err)
    assert "expected the model's context in tokens" in err
