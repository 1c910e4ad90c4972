"""Incremental detokenization: split characters held back, stop strings across deltas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from slopilot.engine.server.detokenizer import IncrementalDetokenizer
from slopilot.engine.server.placeholder_tokenizer import PlaceholderTokenizer


class ByteTokenizer:
    """Each id is one byte: multi-byte characters span tokens, as in byte-level BPE."""

    vocab_size = 256

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            **how: Any) -> str:
        return ""


def _stream(text: str, stop: Sequence[str] = ()) -> tuple[list[str], IncrementalDetokenizer]:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    d = IncrementalDetokenizer(tok, tok.encode("prompt "), stop)
    pieces = []
    for i, t in enumerate(ids):
        d.add([t], final=i == len(ids) - 1)
        pieces.append(d.take(final=i == len(ids) - 1))
    return pieces, d


def test_split_characters_are_held_until_complete() -> None:
    pieces, _ = _stream("héllo ✓")
    assert "".join(pieces) == "héllo ✓"
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_across_deltas_is_never_half_sent() -> None:
    pieces, d = _stream("abc STOP def", stop=["STOP"])
    assert d.stopped
    assert "".join(pieces) == "abc "
    assert not any("S" in p for p in pieces)


def test_earliest_stop_string_wins() -> None:
    pieces, _ = _stream("one two three", stop=["three", "two"])
    assert "".join(pieces) == "one "


def test_no_stop_streams_everything() -> None:
    pieces, d = _stream("plain text", stop=[])
    assert "".join(pieces) == "plain text" and not d.stopped


def test_no_stop_string_ends_within_min_tokens() -> None:
    """As in vLLM (its PR 22014): the text of the first ``min_tokens`` tokens is not
    searched for stop strings; the first match that ends after them stops the output."""
    tok = ByteTokenizer()
    d = IncrementalDetokenizer(tok, tok.encode("prompt "), ["e"], min_tokens=5)
    ids = tok.encode("Lee, a student")
    taken = d.add(ids, final=False)
    assert d.stopped and d.text == "Lee, a stud"
    assert taken == len("Lee, a stude")


def test_a_stop_string_may_begin_within_min_tokens() -> None:
    # Only its end must come after them: "ab" spans the third and fourth token.
    tok = ByteTokenizer()
    d = IncrementalDetokenizer(tok, [], ["ab", "zzzzzz"], min_tokens=3)
    d.add(tok.encode("xxabab"))
    assert d.stopped and d.text == "xx"


def test_incomplete_character_at_the_end_is_flushed() -> None:
    tok = ByteTokenizer()
    d = IncrementalDetokenizer(tok, [], ())
    d.add(list("✓".encode())[:2], final=True)
    assert d.take(final=True) == "\ufffd"


def test_placeholder_tokenizer() -> None:
    tok = PlaceholderTokenizer(1000)
    ids = tok.encode("one two  three")
    assert len(ids) == 3 and ids == tok.encode("one two three")
    assert all(0 <= i < 1000 for i in ids)
    assert tok.decode(ids) == "tok tok tok"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("assistant:")
    with pytest.raises(ValueError, match="vocab_size"):
        PlaceholderTokenizer(0)
