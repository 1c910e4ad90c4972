"""TokenLogprobs (the engine's) to the OpenAI shapes: completions and chat differ.

Completions: parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs`` (a dict of
the top alternatives plus the token itself, so k or k + 1 entries, as OpenAI and vLLM
give; fewer when two ids read alike, since the dict is keyed by text) and
``text_offset`` (where each token's text starts in the choice's text). A prompt token
without context (the first one, under ``echo``) has None for both logprob fields.

Chat: ``content``, one object per token with ``token``, ``logprob``, ``bytes`` and the
``top_logprobs`` list of the k most likely. -inf becomes -9999.0, as in vLLM, since JSON
has no infinities.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from slopilot.engine.request import TokenLogprobs
from slopilot.engine.server.detokenizer import ServerTokenizer

_FLOOR = -9999.0


def _lp(value: float) -> float:
    return max(value, _FLOOR)


class TokenText:
    """Each token id's own text (decoded alone, special tokens kept), memoized."""

    def __init__(self, tokenizer: ServerTokenizer) -> None:
        self._tok = tokenizer
        self.text = lru_cache(maxsize=65536)(self._decode)

    def _decode(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(text_of: TokenText, token_ids: Sequence[int],
                        entries: Sequence[TokenLogprobs | None], num_top: int,
                        text_offset: int) -> dict[str, Any]:
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = text_of.text(token_id)
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
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
            "text_offset": offsets}


def chat_logprobs(text_of: TokenText, entries: Sequence[TokenLogprobs],
                  num_top: int) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = text_of.text(token_id)
        return {"token": text, "logprob": _lp(logprob),
                "bytes": list(text.encode("utf-8", errors="replace"))}

    return {"content": [
        {**item(e.token_id, e.logprob),
         "top_logprobs": [item(t, lp) for t, lp in e.top[:num_top]]}
        for e in entries]}
