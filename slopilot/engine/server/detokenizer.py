"""Token ids to text, one delta at a time, with stop strings applied on the text.

Decoding each new token alone breaks words and multi-byte characters apart, so (as vLLM
does) each step decodes a short window that ends at the new tokens and emits only what
the window gained, holding back text that ends in an incomplete character::

    ids      p p p p p | o o o o  (5 prompt tokens of context, then the outputs)
                 prefix_offset ^       ^ read_offset: decoded and emitted up to here

Stop strings can span deltas: the last ``len(longest stop) - 1`` characters are held
back while streaming, so a stop string is never half-sent before it is recognised.
As in vLLM, no stop string can end in the text of the first ``min_tokens`` output
tokens: a client that asks for at least that many gets them (the engine holds off EOS
and the stop ids just as long).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

# Prompt tokens decoded in front of the outputs, so a leading space or a merge with
# the prompt's last word comes out as the tokenizer means it.
_CONTEXT_TOKENS = 5


class ServerTokenizer(Protocol):
    """What the server needs from a tokenizer (the model's, or a placeholder)."""

    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes the token adds to a text (a special token's: its text): a piece
        of a character too, which ``decode([token_id])`` reads as U+FFFD."""
        ...
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template_kwargs: Mapping[str, Any] | None = None) -> str: ...


class IncrementalDetokenizer:
    """Feeds on output token ids; ``take()`` returns the text not yet handed out."""

    def __init__(self, tokenizer: ServerTokenizer, prompt_ids: Sequence[int],
                 stop: Sequence[str] = (), *, min_tokens: int = 0) -> None:
        self._tok = tokenizer
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._min_tokens = min_tokens
        self._num_output = 0  # output tokens added so far
        self.text = ""
        self._sent = 0
        self.stopped = False  # a stop string matched; ``text`` is cut before it

    def add(self, token_ids: Sequence[int], *, final: bool = False) -> int:
        """Append tokens; on ``final`` flush text held back for incomplete characters.

        Returns how many of ``token_ids`` it took: all of them, or, when a stop string
        matched, those up to the one that completed it (the rest are not output)."""
        for i, token in enumerate(token_ids):
            if self.stopped:
                return i
            self._ids.append(token)
            self._num_output += 1
            self._decode_step(final and i == len(token_ids) - 1)
        if final and not token_ids and not self.stopped:
            self._decode_step(True)
        return len(token_ids)

    def _decode_step(self, flush: bool) -> None:
        ids, decode = self._ids, self._tok.decode
        prefix = decode(ids[self._prefix_offset:self._read_offset])
        full = decode(ids[self._prefix_offset:])
        if len(full) > len(prefix) and (flush or not full.endswith("\ufffd")):
            piece = full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)
            self._append(piece)

    def _append(self, piece: str) -> None:
        old = len(self.text)
        self.text += piece
        if not self._stop or self._num_output <= self._min_tokens:
            return
        # The earliest stop string that ends in this piece (it may begin before it: in an
        # earlier piece, or in the text of the first min_tokens tokens, never searched).
        found = (self.text.find(s, max(0, old - len(s) + 1)) for s in self._stop)
        cut = min((i for i in found if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.stopped = True

    def take(self, *, final: bool = False) -> str:
        """Text not handed out yet; while streaming, keeps back a possible stop prefix."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._holdback
        if end <= self._sent:
            return ""
        out = self.text[self._sent:end]
        self._sent = end
        return out
