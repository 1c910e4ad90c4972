"""Work refused before it is done: an over-large body (413, while it is read) and a
prompt too long for the context whatever it tokenizes to (400, untokenized)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from slopilot.engine.executors.tokenizer import TextTokenizer
from slopilot.engine.server.detokenizer import ServerTokenizer
from slopilot.engine.server.request_limits import max_token_bytes, max_token_bytes_of
from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S

SMALL_BODY = 4096


def _error(res: httpx.Response, status: int) -> dict[str, Any]:
    assert res.status_code == status, res.text
    err: dict[str, Any] = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.fixture(scope="module")
def small_body() -> Iterator[LiveServer]:
    with start_server(max_body_bytes=SMALL_BODY) as srv:
        yield srv


def test_a_declared_body_over_the_cap_is_413_unread(small_body: LiveServer) -> None:
    body = json.dumps({"prompt": "word " * SMALL_BODY, "max_tokens": 2})
    res = httpx.post(small_body.url + "/v1/completions", content=body, timeout=HANG_GUARD_S,
                     headers={"content-type": "application/json"})
    err = _error(res, 413)
    assert f"at most {SMALL_BODY} bytes" in err["message"]
    assert str(len(body)) in err["message"]
    # The flag an operator sets, and the code the meter answers for the same refusal.
    assert "(--max-body-mb)" in err["message"] and err["code"] == "request_too_large"


def test_a_chunked_body_over_the_cap_is_413(small_body: LiveServer) -> None:
    # No Content-Length: the cap holds on the bytes as they arrive.
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(SMALL_BODY // 64 + 1):
            yield b"word " * 13
        yield b'", "max_tokens": 2}'

    res = httpx.post(small_body.url + "/v1/completions", content=chunks(),
                     timeout=HANG_GUARD_S, headers={"content-type": "application/json"})
    assert f"at most {SMALL_BODY} bytes" in _error(res, 413)["message"]


def test_a_body_under_the_cap_is_served(small_body: LiveServer) -> None:
    res = httpx.post(small_body.url + "/v1/completions", timeout=HANG_GUARD_S,
                     json={"prompt": "word " * 100, "max_tokens": 2})
    assert res.status_code == 200, res.text


def _spec(tok: Tokenizer) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(tok.to_str())
    return spec


def test_the_bound_of_a_byte_level_bpe_holds(tiny_random_dir: Path) -> None:
    tok = TextTokenizer.from_dir(tiny_random_dir)
    per_token = max_token_bytes_of(tok.tokenizer)
    vocab = tok.tokenizer.get_vocab(with_added_tokens=True)
    assert per_token == max(max(len(k) for k in vocab), 4)
    rng = random.Random(7)
    alphabet = "ab cd\n\t  é中🙂<|im_start|>" + "".join(map(chr, range(32, 127)))
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        text += " " * rng.randint(0, 100)
        assert len(tok.encode(text, add_special_tokens=False)) * per_token \
            >= len(text.encode())


def _nfkc() -> Tokenizer:
    tok = Tokenizer(models.BPE({"a": 0}, []))
    tok.normalizer = normalizers.NFKC()  # composes: two characters may become one
    return tok


def _whitespace_split() -> Tokenizer:
    tok = Tokenizer(models.BPE({"a": 0}, []))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # drops the spaces
    return tok


@pytest.mark.parametrize("make", [
    lambda: Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")),
    lambda: Tokenizer(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>",
                                 fuse_unk=True)),
    _nfkc, _whitespace_split,
], ids=["wordlevel", "fused-unknowns", "nfkc", "whitespace-split"])
def test_no_bound_where_text_may_shrink(make: Callable[[], Tokenizer]) -> None:
    assert max_token_bytes(_spec(make())) is None


def test_a_metaspace_bpe_counts_bytes_of_entries() -> None:
    tok = Tokenizer(models.BPE({"▁a": 0, "<0x41>": 1, "é": 2}, [], byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    assert max_token_bytes(_spec(tok)) == 6  # "<0x41>", an overestimate: safe


class _Counting:
    """The real tokenizer, counting the characters it was asked to encode."""

    def __init__(self, inner: ServerTokenizer) -> None:
        self.inner = inner
        self.longest = 0

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.longest = max(self.longest, len(text))
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        return self.inner.token_bytes(token_id)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            **how: Any) -> str:
        return self.inner.apply_chat_template(messages, **how)


@pytest.fixture(scope="module")
def counted(tiny_random_dir: Path) -> Iterator[tuple[LiveServer, _Counting]]:
    backend = build_backend("torch", model=str(tiny_random_dir), num_gpu_blocks=64)
    tok = _Counting(backend.tokenizer)
    backend.tokenizer = tok
    with start_server(backend) as srv:
        yield srv, tok


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_no_tokenization_fits_is_refused_untokenized(
        counted: tuple[LiveServer, _Counting], chat: bool) -> None:
    srv, tok = counted
    per_token = srv.backend.max_token_bytes
    assert per_token is not None
    most = (srv.backend.max_model_len - 1) * per_token
    text = "word " * (most // 5 + 1)
    assert len(text) > most
    body: dict[str, Any] = ({"messages": [{"role": "user", "content": text}]} if chat
                            else {"prompt": text})
    path = "/v1/chat/completions" if chat else "/v1/completions"
    tok.longest = 0
    res = httpx.post(srv.url + path, json={**body, "max_tokens": 2}, timeout=HANG_GUARD_S)
    err = _error(res, 400)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == ("messages" if chat else "prompt")
    assert f"no prompt over {most} bytes fits" in err["message"]
    assert tok.longest < len(text)  # never handed to the tokenizer


def test_a_long_prompt_within_the_bound_is_still_tokenized(
        counted: tuple[LiveServer, _Counting]) -> None:
    srv, tok = counted
    # Within the bound, beyond the context once tokenized (a word is a token at least).
    text = "word " * srv.backend.max_model_len
    res = httpx.post(srv.url + "/v1/completions", json={"prompt": text, "max_tokens": 2},
                     timeout=HANG_GUARD_S)
    err = _error(res, 400)
    assert err["code"] == "context_length_exceeded" and "tokens" in err["message"]
    assert tok.longest >= len(text)
