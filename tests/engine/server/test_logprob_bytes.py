"""A token's ``bytes`` are its raw UTF-8 bytes, and ``text_offset`` indexes the choice's
text, for tokens that hold part of a character too.

Decoded alone, such a token reads U+FFFD: its ``bytes`` were that character's
(239, 191, 189), so joining them never rebuilt an emoji or a CJK character, and each
counted one character towards ``text_offset``, which ran past the end of the text. The
tiny model's byte-level BPE spells most non-ASCII characters one byte a token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from slopilot.engine.executors.tokenizer import TextTokenizer
from slopilot.engine.request import TokenLogprobs
from slopilot.engine.server.logprobs_format import TokenText, chat_logprobs, prompt_offsets
from slopilot.engine.server.placeholder_tokenizer import PlaceholderTokenizer
from tests.support.live_server import LiveServer
from tests.support.waits import HANG_GUARD_S

TEXTS = ["Party 🎉🎉 time", "日本語のテキスト", "naïve café ☕ 👩‍👩‍👧", "plain ascii"]
# The bytes of 日 (e6 97 a5) and 本 (e6 9c ac): outputs biased to them are mostly pieces
# of characters, some whole, some no UTF-8 at all.
PIECES = b"\xe6\x97\xa5\x9c\xac"


def _bytes_of(items: list[Any]) -> bytes:
    return b"".join(bytes(i["bytes"] if isinstance(i, dict) else i.bytes) for i in items)


@pytest.fixture(scope="module")
def tiny_tok(tiny_random_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_random_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_the_bytes_of_a_texts_tokens_rebuild_it(tiny_tok: TextTokenizer, text: str) -> None:
    ids = tiny_tok.encode(text, add_special_tokens=False)
    entries = [TokenLogprobs(i, -0.5, 1, ((i, -0.5), (ids[0], -1.0))) for i in ids]
    content = chat_logprobs(TokenText(tiny_tok), entries, 2)["content"]
    assert _bytes_of(content).decode() == text
    assert [item["top_logprobs"][0]["bytes"] for item in content] == \
        [item["bytes"] for item in content]
    if not text.isascii():
        assert any(item["token"] == "\ufffd" for item in content)  # pieces were there


def test_a_special_token_is_its_text_and_the_placeholders_word_has_its_space(
        tiny_tok: TextTokenizer) -> None:
    end = tiny_tok.tokenizer.token_to_id("<|im_end|>")
    assert TokenText(tiny_tok).bytes(end) == b"<|im_end|>"
    # Simulated output reads " tok tok ...": each token adds its word and a space.
    assert TokenText(PlaceholderTokenizer(100)).bytes(7) == b" tok"


def test_a_sentencepiece_tokens_bytes() -> None:
    """Llama-2's kind: "▁" stands for a space, "<0xE6>" for one byte (byte fallback)."""
    vocab = {"<unk>": 0, "▁the": 1, "<0xE6>": 2, "<0x97>": 3, "<0xA5>": 4, "▁": 5, "é": 6}
    raw = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    text_of = TokenText(TextTokenizer(raw, chat_template=None, bos_token=None,
                                      eos_token=None))
    assert [text_of.bytes(i) for i in range(1, 7)] == \
        [b" the", b"\xe6", b"\x97", b"\xa5", b" ", "é".encode()]


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                         timeout=HANG_GUARD_S)


def _gpt2_char(byte: int) -> str:
    """GPT-2's byte-level alphabet (``bytes_to_unicode``): printable Latin-1 bytes stand
    for themselves, the others for 256 and on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if byte in printable:
        return chr(byte)
    return chr(256 + [b for b in range(256) if b not in printable].index(byte))


_GPT2_BYTE = {_gpt2_char(b): b for b in range(256)}


def _bias(tok: TextTokenizer) -> dict[str, int]:
    """Outputs among the pieces of 日 and 本, and never a special token (which the text
    leaves out)."""
    special = [tok.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>",
                                                      "<|im_end|>")]
    pieces = [tok.tokenizer.token_to_id(_gpt2_char(b)) for b in PIECES]
    assert None not in pieces
    return {**{str(i): -100 for i in special}, **{str(i): 100 for i in pieces}}


def _char_of_each_byte(raw: bytes) -> list[int]:
    """The index, in ``raw`` decoded with U+FFFD for what is no UTF-8 (as the server
    decodes), of the character each byte is part of: one U+FFFD stands for each invalid
    stretch the strict decoder reports."""
    out: list[int] = []
    chars = 0
    while raw:
        try:
            good, bad, raw = raw.decode(), b"", b""
        except UnicodeDecodeError as exc:
            good = raw[:exc.start].decode()
            bad, raw = raw[exc.start:exc.end], raw[exc.end:]
        for ch in good:
            out += [chars] * len(ch.encode())
            chars += 1
        if bad:
            out += [chars] * len(bad)
            chars += 1
    return out


def test_a_chats_token_bytes_rebuild_its_text(torch_server: LiveServer,
                                              tiny_tok: TextTokenizer) -> None:
    res = _client(torch_server).chat.completions.create(
        model=torch_server.backend.served_model_name, max_completion_tokens=24, seed=3,
        temperature=1.0, logprobs=True, top_logprobs=2, logit_bias=_bias(tiny_tok),
        messages=[{"role": "user", "content": "Repeat: 🎉🎉 日本語"}],
        extra_body={"ignore_eos": True})
    choice = res.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    raw = _bytes_of(content)
    assert len(content) == 24 and set(raw) <= set(PIECES)
    assert raw.decode("utf-8", "replace") == choice.message.content


def test_completion_offsets_index_the_text_for_pieces_of_characters(
        torch_server: LiveServer, tiny_tok: TextTokenizer) -> None:
    """Each token's offset is that of the character its first byte is part of: where
    its text starts, or for one that starts inside a character, that character's."""
    prompt = "Party 🎉 日本語 ☕ done"
    body: dict[str, Any] = dict(
        model=torch_server.backend.served_model_name, prompt=prompt, max_tokens=12,
        echo=True, logprobs=1, seed=5, temperature=1.0, logit_bias=_bias(tiny_tok),
        ignore_eos=True)
    res = httpx.post(torch_server.url + "/v1/completions", timeout=HANG_GUARD_S,
                     json={**body, "return_token_ids": True})
    choice = res.json()["choices"][0]
    text, offsets = choice["text"], choice["logprobs"]["text_offset"]
    ids = [*tiny_tok.encode(prompt), *choice["token_ids"]]
    assert choice["prompt_token_ids"] == ids[:-12]
    # Where each token's bytes start, by the tokenizer's own alphabet.
    raw = [tiny_tok.tokenizer.id_to_token(i) for i in ids]
    per_token = [bytes(_GPT2_BYTE[c] for c in piece) for piece in raw]
    starts = [sum(map(len, per_token[:k])) for k in range(len(per_token))]
    assert b"".join(per_token).decode("utf-8", "replace") == text
    char_of = _char_of_each_byte(b"".join(per_token))
    assert offsets == [char_of[s] for s in starts]
    assert offsets[-1] < len(text)
    streamed = [o for c in _client(torch_server).completions.create(
                    **{k: v for k, v in body.items() if k != "ignore_eos"},
                    extra_body={"ignore_eos": True}, stream=True)
                for ch in c.choices if ch.logprobs and ch.logprobs.text_offset
                for o in ch.logprobs.text_offset]
    assert streamed == offsets


def test_simulated_offsets_count_each_words_space(sim_server: LiveServer) -> None:
    """The placeholder's output reads " tok tok ...": each token starts at its space."""
    choice = _client(sim_server).completions.create(
        model=sim_server.backend.served_model_name, prompt="a b", max_tokens=4,
        logprobs=0, extra_body={"ignore_eos": True}).choices[0]
    assert choice.text == " tok" * 4
    assert choice.logprobs is not None and choice.logprobs.text_offset == [0, 4, 8, 12]


def _sentencepiece(metaspace: bool) -> TextTokenizer:
    """Llama 2's kind (Replace, ByteFallback, Fuse, Strip), or a Metaspace decoder: the
    first token's "▁" is a space the decoded text, and the client's prompt, leave out."""
    pieces = ["<unk>", "<s>", "</s>", "▁the", "▁Hello", "▁world", "Hello", "▁", "日"]
    raw = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0,
                                   byte_fallback=False))
    if metaspace:
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.decoder = decoders.Metaspace()
    else:
        raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        raw.decoder = decoders.Sequence([decoders.Replace("▁", " "),
                                         decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    raw.add_special_tokens(["<s>"])
    return TextTokenizer(raw, chat_template=None, bos_token="<s>", eos_token=None)


@pytest.mark.parametrize(("metaspace", "prompt", "expected"), [
    (False, "Hello world the", [0, 0, 5, 11]),
    (True, "Hello world the", [0, 0, 5, 11]),
    # "▁" then "▁Hello": the decoder drops the first of the two spaces.
    (False, " Hello world the", [0, 0, 0, 6, 12]),
    # Metaspace splits on the space: the tokens keep none before "Hello".
    (True, " Hello world the", [0, 0, 6, 12])],
    ids=["llama2", "metaspace", "llama2-leading-space", "metaspace-leading-space"])
def test_echoed_prompt_offsets_leave_out_the_space_the_decoder_drops(
        metaspace: bool, prompt: str, expected: list[int]) -> None:
    """Each prompt token's offset is that of its first byte's character in the client's
    own string. The first token's "▁" is a space the decoder drops and the client never
    wrote; counted, every offset after it was one too high: [0, 0, 6, 12] for "<s>",
    "▁Hello", "▁world", "▁the"."""
    tok = _sentencepiece(metaspace)
    bos = tok.tokenizer.token_to_id("<s>")
    assert bos is not None
    ids = [bos, *tok.encode(prompt, add_special_tokens=False)]
    assert prompt_offsets(TokenText(tok), ids, prompt) == expected


def test_an_added_tokens_bytes_are_what_the_decoder_makes_of_it() -> None:
    """An added token that is not special goes through a byte-level decoder like any
    other: "Ġhi" decodes to " hi", and its bytes were its spelling, b"\\xc4\\xa0hi", so
    a choice's joined bytes read "Ġhi" where its text reads " hi". One the alphabet
    cannot read (a space in it, CJK) is its text, as is a special one."""
    raw = Tokenizer(models.BPE({"a": 0, "Ġ": 1, "h": 2, "i": 3}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_tokens([AddedToken("Ġhi", special=False), AddedToken(" <sep> ", special=False),
                    AddedToken("日本語", special=False)])
    raw.add_special_tokens([AddedToken("<|end|>", special=True)])
    text_of = TokenText(TextTokenizer(raw, chat_template=None, bos_token=None,
                                      eos_token=None))
    for content, expected in [("Ġhi", b" hi"), (" <sep> ", b" <sep> "),
                              ("日本語", "日本語".encode()), ("<|end|>", b"<|end|>")]:
        token_id = raw.token_to_id(content)
        assert token_id is not None
        assert text_of.bytes(token_id) == expected, content
        assert raw.decode([token_id], skip_special_tokens=False).encode() == expected
