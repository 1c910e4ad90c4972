"""The tokenizer of a simulated model: one token per word, every token reads "tok".

The simulated executor has no vocabulary worth reading, only a cost model that wants
prompt lengths. Counting words as tokens keeps a prompt's length predictable for anyone
driving a simulated server (a demo, a load generator), and decoding every id as the same
word makes the output length visible in the text.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any


class PlaceholderTokenizer:
    def __init__(self, vocab_size: int, word: str = "tok") -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size}: must be at least 1")
        self._vocab_size = vocab_size
        self.word = word

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        # A stable hash, so the same words give the same ids (prefix caching works).
        return [zlib.crc32(w.encode()) % self._vocab_size for w in text.split()]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return " ".join(self.word for _ in ids)

    def token_bytes(self, token_id: int) -> bytes:
        # What each token adds to an output, its word after a space (" tok tok ..."), as
        # the detokenizer, which decodes it after others, reads it.
        return f" {self.word}".encode()

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template_kwargs: Mapping[str, Any] | None = None) -> str:
        # No template, so no variables to read; the last line is the final message's end.
        lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
        if add_generation_prompt and not continue_final_message:
            lines.append("assistant:")
        return "\n".join(lines)
