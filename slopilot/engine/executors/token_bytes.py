"""Each token's raw bytes, read from a tokenizer.json's vocabulary: what it adds to the
text (OpenAI's logprob ``bytes``; joined, a choice's tokens rebuild its text).

Decoding one token alone cannot give them: a token that holds part of a multi-byte
character (an emoji or a CJK character spelled byte by byte) decodes to U+FFFD. The
vocabulary has them, spelled the way its decoder reads:

- byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2): one character of GPT-2's alphabet per
  byte (``bytes_to_unicode``: "Ġ" is a space);
- SentencePiece's kind (Llama 2, Mistral): "▁" for a space, "<0xE6>" for a byte of byte
  fallback, the rest as UTF-8.

An added token (``<|im_end|>``) is its text, but for one that is not special under a
byte-level decoder, which reads it like the vocabulary where it can ("Ġhi" is " hi").
Any other decoder (WordPiece's "##", CTC) has no such reading: those tokens are their
text decoded alone, as before; WordPiece's drop the spaces between words, so their
bytes joined do not rebuild the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, reversed: printable Latin-1 bytes stand for
    themselves, the other bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


_BYTE_OF = _gpt2_alphabet()


def _byte_level(piece: str) -> bytes | None:
    try:
        return bytes(_BYTE_OF[c] for c in piece)
    except KeyError:
        return None  # not of the alphabet: an added token's text


def _sentencepiece(space: str, byte_fallback: bool) -> Callable[[str], bytes | None]:
    def read(piece: str) -> bytes | None:
        if byte_fallback and (found := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(found.group(1), 16)])
        return piece.replace(space, " ").encode()
    return read


def _reader(decoder: Mapping[str, Any] | None) -> Callable[[str], bytes | None] | None:
    """How a vocabulary entry reads as bytes under ``decoder`` (tokenizer.json's), or
    None where this module knows no reading."""
    if decoder is None:
        return None
    kind = decoder.get("type")
    if kind == "ByteLevel":
        return _byte_level
    if kind == "Metaspace":
        return _sentencepiece(str(decoder.get("replacement", "\u2581")), False)
    if kind != "Sequence":
        return None
    steps = list(decoder.get("decoders") or ())
    if any(s.get("type") == "ByteLevel" for s in steps):
        return _byte_level
    space = None
    byte_fallback = False
    for step in steps:
        match step.get("type"):
            case "Replace" if step.get("content") == " ":
                space = (step.get("pattern") or {}).get("String")
            case "Metaspace":
                space = step.get("replacement", "\u2581")
            case "ByteFallback":
                byte_fallback = True
            case "Fuse" | "Strip":
                pass  # joins the pieces, or trims the text's ends: no token's bytes
            case _:
                return None
    if not isinstance(space, str) or not space:
        return None
    return _sentencepiece(space, byte_fallback)


class TokenBytes:
    """``token_bytes(id)``: the raw bytes a token of ``tokenizer`` stands for."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    # Read on first use: a large vocabulary's JSON takes a while to write, and most
    # tokenizers built (tests, tools) are never asked for logprobs.
    @cached_property
    def _added(self) -> dict[int, bytes]:
        return {i: self._added_bytes(str(t.content), bool(t.special))
                for i, t in self._tok.get_added_tokens_decoder().items()}

    def _added_bytes(self, content: str, special: bool) -> bytes:
        """A byte-level decoder reads an added token that is not special as it reads
        the vocabulary ("Ġhi" decodes to " hi"), where every character of it is of the
        alphabet; else, or special, the token is its text."""
        if not special and self._read is _byte_level:
            read = _byte_level(content)
            if read is not None:
                return read
        return content.encode()

    @cached_property
    def _read(self) -> Callable[[str], bytes | None] | None:
        spec = json.loads(self._tok.to_str())
        return _reader(spec.get("decoder") if isinstance(spec, dict) else None)

    def __call__(self, token_id: int) -> bytes:
        added = self._added.get(token_id)
        if added is not None:
            return added
        piece = self._tok.id_to_token(token_id)
        read = None if piece is None or self._read is None else self._read(piece)
        if read is not None:
            return read
        return str(self._tok.decode([token_id], skip_special_tokens=False)).encode()
