"""Token ids the model has no row for are refused at the door, never fed to the engine.

A checkpoint's tokenizer may hold more ids than the model's embedding and output layer
(tokens added to the tokenizer, the model never resized: a pad token added for training
is the usual case). The server bounded ids by the tokenizer's count, so one request
naming such an id, or a text prompt holding such a token's text, reached the embedding
lookup: an IndexError on the engine thread, which failed every request on the server
from then on ("engine_dead", restart it); on CUDA a device-side assert does the same.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.live_server import LiveServer, start_server
from tests.support.waits import HANG_GUARD_S

pytest.importorskip("torch")

EXTRA = 8  # tokens the tokenizer holds beyond the model's vocabulary


@dataclass
class Wider:
    srv: LiveServer
    model_vocab: int
    last_id: int  # the tokenizer's last id, past the model's rows
    last_text: str  # that token's text


@pytest.fixture(scope="module")
def wider(tiny_random_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wider]:
    """tiny-random with ``EXTRA`` special tokens added to its tokenizer only."""
    from tokenizers import Tokenizer

    model_vocab = int(json.loads((tiny_random_dir / "config.json").read_text())["vocab_size"])
    path = tmp_path_factory.mktemp("wider") / "tiny-wider"
    shutil.copytree(tiny_random_dir, path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    missing = model_vocab - tok.get_vocab_size()
    tok.add_special_tokens([f"<extra_{i}>" for i in range(missing + EXTRA)])
    last = tok.get_vocab_size() - 1
    assert last == model_vocab + EXTRA - 1
    text = tok.id_to_token(last)
    tok.save(str(path / "tokenizer.json"))
    with start_server(executor="torch", model=str(path), served_model_name="tiny-wider",
                      num_gpu_blocks=64, num_cpu_blocks=16) as srv:
        yield Wider(srv, model_vocab, last, text)


Body = Callable[[int, str], dict[str, Any]]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", lambda i, t: {"prompt": [1, 2, i]}, "prompt"),
    ("/v1/completions", lambda i, t: {"prompt": f"hi {t}"}, "prompt"),
    ("/v1/completions", lambda i, t: {"prompt": ["hi", f"hi {t}"]}, "prompt"),
    ("/v1/chat/completions",
     lambda i, t: {"messages": [{"role": "user", "content": f"hi {t}"}]}, "messages"),
    ("/v1/completions", lambda i, t: {"prompt": "hi", "logit_bias": {str(i): 5}},
     "logit_bias"),
    ("/v1/completions", lambda i, t: {"prompt": "hi", "stop_token_ids": [i]},
     "stop_token_ids"),
], ids=["token-ids", "text", "batch-text", "chat", "logit-bias", "stop-token-ids"])
def test_an_id_past_the_models_vocabulary_is_a_400_and_the_engine_lives(
        wider: Wider, path: str, body: Body, param: str) -> None:
    srv = wider.srv
    sent = body(wider.last_id, wider.last_text)
    res = httpx.post(srv.url + path, json=sent | {"max_tokens": 2}, timeout=HANG_GUARD_S)
    assert res.status_code == 400, res.text
    err = res.json()["error"]
    assert err["param"] == param
    assert str(wider.last_id) in err["message"]
    assert str(wider.model_vocab) in err["message"]
    # The engine never saw it: the next request is served, nothing is left behind.
    ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                    timeout=HANG_GUARD_S)
    assert ok.status_code == 200, ok.text
    assert srv.engine.error is None

    def state(e: Any) -> tuple[int, int]:
        e.scheduler.check_integrity()
        return len(e.scheduler.requests), e.scheduler.kv.num_used_blocks
    assert srv.call(state) == (0, 0)
