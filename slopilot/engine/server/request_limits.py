"""What the server refuses before spending real work on it: an over-large body, a body
of more JSON values than any servable request needs, and a prompt too long to fit the
context however it tokenizes.

Tokenizing is the costly part of admitting a request (a 20 MB prompt took 8-13 s and
2.3 GB on a tokenizer thread only to be refused for its length), so these checks come
first. ``BodyLimit`` answers 413 while the body is still being read: from its
Content-Length when it gives one, else as soon as the bytes received pass the cap, or
(``ItemLimit``) as soon as its JSON items counted so far do. Parsing a body is one
GIL-holding call of ``json.loads`` and one of pydantic, on the event loop (on a thread
as well: neither lets go of the GIL), and its cost is its values, not its bytes: 16.5 MB
of one ignored field ``[1, 1, ...]`` held every stream for 2-5 s. The items bound is what
the deployment can serve (``body_items.body_items_bound``): a batch of token-id prompts filling the
context, a full-vocabulary ``logit_bias``; past it the body is refused unparsed.
``max_token_bytes`` derives, once per tokenizer, the most UTF-8 bytes one token can stand
for; a prompt of more than ``(max_model_len - 1) * that`` bytes needs more tokens than
the context holds, whatever it says, so it is refused untokenized.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slopilot.engine.body_items import ItemLimit, within
from slopilot.engine.json_items import BODY_SCAN, JsonItems
from slopilot.engine.server.errors import APIError

# Room for a full 128k-token context as token ids in a batch of prompts, or as text of
# long tokens, with JSON around it; far below what a worker can hold a few of at once.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20


# Names the flag that sets the limit (``slopilot serve --max-body-mb``), as the meter's does.
PROMPT_HINT = "(--max-body-mb): send a shorter prompt or split the batch"


def _too_large(size: str, limit: int, hint: str) -> str:
    return f"the request body is {size} bytes; this server accepts at most {limit} bytes {hint}"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` while FastAPI reads the body: it re-raises an
    HTTPException as it is (any other error there becomes a 400 "error parsing")."""


class BodyLimit:
    """Pure ASGI middleware: 413 for a body over ``max_bytes``, or with ``items`` over
    its JSON items, read no further; ``hint`` ends the bytes' message with what the
    client can do.

    The items are counted from the bytes as they arrive (``json_items``), before anything
    parses them, and the scan is left in ``BODY_SCAN`` for the validator."""

    def __init__(self, app: ASGIApp, max_bytes: int, hint: str = PROMPT_HINT,
                 items: ItemLimit | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_body_bytes={max_bytes}: must be at least 1")
        self.app = app
        self.max_bytes = max_bytes
        self.hint = hint
        self.items = items

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            # Refused before a byte of it is read.
            err = APIError(413, _too_large(str(declared), limit, self.hint))
            await err.response()(scope, receive, send)
            return
        received = 0
        items = self.items
        scan = JsonItems() if items is not None else None

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > limit:
                    raise BodyTooLarge(413, _too_large(f"over {limit}", limit, self.hint))
                if scan is not None and items is not None:
                    await _count(scan, chunk, items)
                    scan.complete = not message.get("more_body", False)
            return message

        token = BODY_SCAN.set(scan)
        try:
            await self.app(scope, limited, send)
        finally:
            BODY_SCAN.reset(token)


async def _count(scan: JsonItems, chunk: bytes, items: ItemLimit) -> None:
    """``chunk`` counted into ``scan`` in steps (``body_items.within``); the 413 past the
    bound."""
    if not await within(scan, chunk, items.max_items):
        raise BodyTooLarge(413, items.message())


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP layer refuses a malformed one itself
    return None


# Normalizers that never shorten the text in UTF-8 bytes: after them a token still
# stands for at most its own bytes of the original. Composition (NFC, NFKC), stripping
# and whitespace collapsing can shorten it, and then no bound holds.
_KEEPS_LENGTH = {"NFD", "NFKD", "Prepend"}
# Pre-tokenizers that split without dropping characters (Whitespace drops them).
_SPLITS_ONLY = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation",
                "UnicodeScripts"}


def _normalizer_keeps_length(n: Mapping[str, Any] | None) -> bool:
    if n is None:
        return True
    kind = n.get("type")
    if kind == "Sequence":
        return all(_normalizer_keeps_length(x) for x in n.get("normalizers", []))
    if kind == "Replace":
        pattern, content = n.get("pattern", {}), n.get("content", "")
        return ("String" in pattern and isinstance(content, str)
                and len(content.encode()) >= len(str(pattern["String"]).encode()))
    return kind in _KEEPS_LENGTH


def _pre_tokenizers(p: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    """The pre-tokenizers in order, or None if one may drop characters."""
    if p is None:
        return []
    if p.get("type") == "Sequence":
        out: list[Mapping[str, Any]] = []
        for x in p.get("pretokenizers", []):
            inner = _pre_tokenizers(x)
            if inner is None:
                return None
            out += inner
        return out
    if p.get("type") not in _SPLITS_ONLY or p.get("behavior") == "Removed":
        return None
    return [p]


def max_token_bytes(spec: Mapping[str, Any]) -> int | None:
    """The most UTF-8 bytes of prompt one token can stand for, from a tokenizer.json
    (``Tokenizer.to_str()``); None when no such bound holds for this tokenizer.

    Only BPE qualifies: each token is a vocabulary entry (or a literal added token), an
    unknown character is one token unless ``fuse_unk`` merges a run of them, and under a
    ByteLevel pre-tokenizer every character of an entry stands for one byte. Anything
    that may drop or shorten text (normalizers, pre-tokenizers), merge unknowns, or
    truncate makes it None: then only the body cap bounds the work.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or spec.get("truncation") is not None:
        return None
    if model.get("unk_token") is not None and model.get("fuse_unk"):
        return None
    if not _normalizer_keeps_length(spec.get("normalizer")):
        return None
    pre = _pre_tokenizers(spec.get("pre_tokenizer"))
    if pre is None:
        return None
    vocab = model.get("vocab") or {}
    if not isinstance(vocab, Mapping) or not vocab:
        return None
    if any(p.get("type") == "ByteLevel" for p in pre):
        longest = max(len(k) for k in vocab)  # one character per byte
    else:
        # An entry's own bytes bound what it stands for ("▁" is 3 bytes for a space,
        # "<0x41>" 6 for one byte): an overestimate only loosens the bound.
        longest = max(len(k.encode()) for k in vocab)
    added = [len(str(t.get("content", "")).encode()) for t in spec.get("added_tokens", [])]
    # An unknown character (at most 4 bytes) is a token of its own.
    return max([longest, 4, *added])


def max_token_bytes_of(tokenizer: Any) -> int | None:
    """``max_token_bytes`` of a ``tokenizers.Tokenizer``, or None for anything else."""
    to_str = getattr(tokenizer, "to_str", None)
    if to_str is None:
        return None
    spec = json.loads(to_str())
    return max_token_bytes(spec) if isinstance(spec, dict) else None
