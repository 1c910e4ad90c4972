"""The most JSON items a request body for generation needs, for a model of a given context
and vocabulary, and the count of a body's items against it as its bytes arrive: past it
the body is refused unparsed (413), by the server (``server.request_limits.BodyLimit``)
and by the meter in front of vLLM (``meter.proxy``), whose frontend parses bodies on its
event loop too.

Parsing a body is one GIL-holding call of ``json.loads`` and one of pydantic, and its cost
is its values, not its bytes: 16.5 MB of one ignored field ``[1, 1, ...]`` held every
stream for 2-5 s. The bound is what the deployment can serve: a batch of token-id prompts
filling the context, a full-vocabulary ``logit_bias``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from slopilot.engine.json_items import JsonItems

# Per token of context: a prompt of token ids is one item a token, a chat message an
# object of two members (role, content) and its content parts three each, and each
# message or part costs at least a token of text or template; 16 is that with room,
# and as many as the batch of prompts a completions request may send (the server's
# ``protocol.MAX_CHOICES``, which this package may not import: the meter imports it).
ITEMS_PER_CONTEXT_TOKEN = 16
# Token ids named once each: logit_bias (a key and its value one member) and
# stop_token_ids, each at most the vocabulary.
ITEMS_PER_VOCAB_TOKEN = 2
# Every other field: 16 stop strings, chat_template_kwargs, stream_options, the flags.
OTHER_ITEMS = 1 << 16
SCAN_STEP = 64 << 10
"""The most bytes of one ASGI message counted before the loop is let run: some 3 ms of
JSON dense with short strings (800,000 keys), 0.1-0.5 ms of numbers or text. uvicorn
hands a body over as the socket gives it, often more than this at once, an in-process
client (a test's) all of it."""


def body_items_bound(max_model_len: int, vocab_size: int) -> int:
    """The most JSON items (array items and object members, ``json_items``) a servable
    request's body needs, for a model of ``max_model_len`` tokens of context and
    ``vocab_size`` token ids."""
    return (ITEMS_PER_CONTEXT_TOKEN * max_model_len + ITEMS_PER_VOCAB_TOKEN * vocab_size
            + OTHER_ITEMS)


@dataclass(frozen=True)
class ItemLimit:
    """The JSON items a body may hold (``body_items_bound``) for a model of
    ``max_model_len`` tokens of context and ``vocab_size`` token ids."""

    max_model_len: int
    vocab_size: int

    @property
    def max_items(self) -> int:
        return body_items_bound(self.max_model_len, self.vocab_size)

    def message(self, reader: str = "this server", vocabulary: str = "its") -> str:
        """The 413's text: the bound, what it is made of, and what the client can do;
        ``reader`` names who refused it, ``vocabulary`` whose vocabulary it counts."""
        return (
            f"the request body holds more than {self.max_items:,} JSON values (array "
            f"items and object members); {reader} reads at most {self.max_items:,} "
            f"JSON values: {ITEMS_PER_CONTEXT_TOKEN} per token of its "
            f"{self.max_model_len:,}-token context (a batch of prompts of token ids, a "
            f"chat's messages), {ITEMS_PER_VOCAB_TOKEN} per token of {vocabulary} "
            f"{self.vocab_size:,}-token vocabulary (logit_bias, stop_token_ids) and "
            f"{OTHER_ITEMS:,} for the other fields: leave out fields the API does not "
            "read, and send each prompt within the context")


async def within(scan: JsonItems, chunk: bytes | bytearray, max_items: int) -> bool:
    """``chunk`` counted into ``scan``, ``SCAN_STEP`` bytes a step, the loop let run
    between two steps of a long chunk; False as soon as the count passes ``max_items``
    (the rest of the chunk left uncounted)."""
    for start in range(0, len(chunk), SCAN_STEP):
        if start:
            await asyncio.sleep(0)
        if scan.feed(bytes(chunk[start:start + SCAN_STEP])) > max_items:
            return False
    return True
