"""What the meter knows of vLLM's model for the bound on a body's JSON items
(``body_items``): its context, learned from vLLM's ``GET /v1/models`` (each model card
gives ``max_model_len``) once vLLM answers it, and a vocabulary vLLM does not say.

- Until vLLM has answered (it loads its model for minutes after the meter starts, and
  serves nothing meanwhile), the context is ``DEFAULT_MAX_MODEL_LEN``, 131,072 tokens
  (Llama 3.1's and most long-context models'): a bound of 2,686,976 items, which still
  refuses the body of 5.5 million ignored items that held vLLM's loop for seconds.
- The vocabulary is ``VOCAB_SIZE``, 262,144 (2^18; Gemma 3's 262k, the largest of common
  models; Llama 4's is 202k, Qwen's 152k, Llama 3's 128k): generous, since vLLM's API
  does not say its own, and a full-vocabulary ``logit_bias`` must pass.
- Asked again every ``RETRY_S`` while vLLM does not answer or fails (a connection refused,
  a 5xx); an answer that refuses (a 401 of a vLLM run with ``--api-key``, which the meter
  does not hold) or names no context leaves the default for good, with a warning.
- Given (``slopilot meter --max-model-len``), the context is that, and vLLM is not asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from slopilot.engine.body_items import ItemLimit

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 131_072
MAX_CONTEXT = 10_000_000
"""The most ``--max-model-len`` takes: ten times the longest contexts served today, whose
bound (160M values) still refuses a body before it can hold vLLM's loop for minutes."""
VOCAB_SIZE = 262_144
RETRY_S = 2.0
MODELS_PATH = "/v1/models"


class ModelContext:
    """The context of the model vLLM serves: ``DEFAULT_MAX_MODEL_LEN`` until ``learn``
    read it from vLLM's model cards (the largest of them: a LoRA adapter's card gives
    its base's)."""

    def __init__(self, given: int | None = None) -> None:
        self.max_model_len = DEFAULT_MAX_MODEL_LEN if given is None else given
        self.learned = False
        self.given = given is not None
        """Stated by the meter's operator: nothing to learn."""

    def limit(self) -> ItemLimit:
        """The items a body may hold for the context known now."""
        return ItemLimit(self.max_model_len, VOCAB_SIZE)

    async def learn(self, client: httpx.AsyncClient, upstream: str) -> bool:
        """Asks vLLM's ``/v1/models`` once; whether to stop asking (an answer came)."""
        try:
            response = await client.get(upstream + MODELS_PATH)
        except httpx.HTTPError as exc:
            log.debug("%s: vLLM did not answer yet: %s", MODELS_PATH, type(exc).__name__)
            return False
        if response.status_code >= 500:
            return False
        lens = _context_lengths(response) if response.status_code == 200 else []
        if not lens:
            log.warning("%s answered %d with no max_model_len: the meter bounds a body's "
                        "JSON items for a %d-token context (the default)", MODELS_PATH,
                        response.status_code, self.max_model_len)
            return True
        self.max_model_len, self.learned = max(lens), True
        log.info("vLLM's context is %d tokens: a request body may hold at most %d JSON "
                 "values", self.max_model_len, self.limit().max_items)
        return True

    async def watch(self, client: httpx.AsyncClient, upstream: str,
                    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        """``learn`` until vLLM answers, ``RETRY_S`` apart; nothing where ``given``."""
        while not self.given and not await self.learn(client, upstream):
            await sleep(RETRY_S)


def _context_lengths(response: httpx.Response) -> list[int]:
    try:
        cards = response.json().get("data")
    except (ValueError, AttributeError):
        return []
    if not isinstance(cards, list):
        return []
    return [n for card in cards if isinstance(card, dict)
            and isinstance(n := card.get("max_model_len"), int) and n > 0]
