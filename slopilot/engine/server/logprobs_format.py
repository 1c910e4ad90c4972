"""TokenLogprobs (the engine's) to the OpenAI shapes: completions and chat differ.

Completions: parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs`` (a dict of
the top alternatives plus the token itself, so k or k + 1 entries, as OpenAI and vLLM
give; fewer when two ids read alike, since the dict is keyed by text) and
``text_offset`` (where each token starts in the choice's text: ``TextOffsets``). A prompt
token without context (the first one, under ``echo``) has None for both logprob fields.

Chat: ``content``, one object per token with ``token``, ``logprob``, ``bytes`` and the
``top_logprobs`` list of the k most likely. -inf becomes -9999.0, as in vLLM, since JSON
has no infinities.

``token`` (and a completions' top_logprobs key) is the token decoded alone, as vLLM
writes it: U+FFFD for a token that holds only part of a character, and without the
leading space a SentencePiece token drops alone. ``bytes`` are the token's raw bytes
(the tokenizer's ``token_bytes``), so a choice's joined, as OpenAI's do, rebuild its text
(a special token's are its text, which the choice's text leaves out), for byte-level BPE
and SentencePiece tokenizers (not WordPiece; nor a byte fallback run that is no UTF-8:
``TextOffsets``).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from slopilot.engine.request import TokenLogprobs
from slopilot.engine.server.detokenizer import ServerTokenizer

_FLOOR = -9999.0


def _lp(value: float) -> float:
    return max(value, _FLOOR)


class TokenText:
    """Each token id's own text (decoded alone, special tokens kept), its raw bytes, and
    the bytes it adds to an output's text; memoized."""

    def __init__(self, tokenizer: ServerTokenizer) -> None:
        self._tok = tokenizer
        self.text = lru_cache(maxsize=65536)(self._decode)
        self.bytes = lru_cache(maxsize=65536)(tokenizer.token_bytes)
        self.shown = lru_cache(maxsize=65536)(self._shown)

    def _decode(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def _shown(self, token_id: int) -> bytes:
        """Its bytes, or none for a token the output's text leaves out: one decoding
        drops where it skips special tokens, as the detokenizer decodes."""
        if self._tok.decode([token_id]) == "" and self.text(token_id) != "":
            return b""
        return self.bytes(token_id)


class TextOffsets:
    """Where each token of a text starts in it, the tokens fed in order (``next``).

    A token's offset is the index of the character its first byte is part of, in the
    text its bytes decode to (U+FFFD standing for each stretch that is no UTF-8, as the
    detokenizer writes it): where its text starts, or, for a token that starts inside a
    character (the second of an emoji's four byte tokens), that character's, so the
    tokens of one character share its offset. A token that adds nothing to the text (a
    special token, the stop token) has the offset where the text then ends. The tokens
    of a stop string keep the offsets they had before the text was cut in front of it:
    past its end.

    Scope: U+FFFD is counted once per invalid stretch, as Python's decoder and a
    byte-level BPE decoder (Rust's ``from_utf8_lossy``) write it. A SentencePiece byte
    fallback decoder writes one per byte of a run of byte tokens that is no UTF-8 (an
    ASCII byte inside it too): after such a run the offsets here fall short of that text
    by the difference ("<0xE6><0x97>▁the" reads "�� the": offsets 0, 0, 1 where the
    text has its tokens at 0, 1, 2).
    Following it would take each token's kind (byte piece or not) and, while streaming,
    offsets already sent that a later byte of the run turns wrong, so it is left as is.
    """

    def __init__(self, start: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = start  # characters the bytes fed so far make, the last unfinished

    def next(self, raw: bytes) -> int:
        if not raw:
            return self._chars
        self._chars += len(self._decoder.decode(raw[:1]))
        # The first byte waits for more (a character's lead byte or one inside it): it
        # is part of the character still to come, else of the last one made.
        pending = bool(self._decoder.getstate()[0])
        at = self._chars if pending else self._chars - 1
        self._chars += len(self._decoder.decode(raw[1:]))
        return at


def prompt_offsets(text_of: TokenText, token_ids: Sequence[int], text: str) -> list[int]:
    """Each prompt token's text_offset in the echoed prompt: ``text``, the client's own
    string, where the tokens may read otherwise (a BOS token, or a tokenizer that
    normalizes). A SentencePiece decoder (Llama 2's Strip, Metaspace's prepend scheme)
    drops the first token's leading "▁", a space the client never wrote: where the
    tokens' bytes begin with more spaces than ``text``, those are left out of the count,
    as outputs' offsets count the text as the client sees it."""
    shown = [text_of.shown(t) for t in token_ids]
    joined = b"".join(shown)
    dropped = (len(joined) - len(joined.lstrip(b" "))) - (len(text) - len(text.lstrip(" ")))
    at = TextOffsets(-max(dropped, 0))
    return [min(max(at.next(raw), 0), len(text)) for raw in shown]


def completion_logprobs(text_of: TokenText, token_ids: Sequence[int],
                        entries: Sequence[TokenLogprobs | None], num_top: int,
                        offsets: Sequence[int]) -> dict[str, Any]:
    """``offsets``: each token's ``text_offset`` (``TextOffsets``)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = text_of.text(token_id)
        tokens.append(text)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(_lp(entry.logprob))
        # Keyed by text, best first: two ids that read alike keep the likelier value.
        top: dict[str, float] = {}
        for t, lp in entry.top[:num_top]:
            top.setdefault(text_of.text(t), _lp(lp))
        top.setdefault(text, _lp(entry.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": list(offsets)}


def chat_logprobs(text_of: TokenText, entries: Sequence[TokenLogprobs],
                  num_top: int) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": text_of.text(token_id), "logprob": _lp(logprob),
                "bytes": list(text_of.bytes(token_id))}

    return {"content": [
        {**item(e.token_id, e.logprob),
         "top_logprobs": [item(t, lp) for t, lp in e.top[:num_top]]}
        for e in entries]}
