"""The longest request a deployment serves: the model's context, at most its KV cache.

One rule for the server and its twin. The server advertises ``servable_tokens`` on
/v1/models and answers a longer request 400 ``context_length_exceeded``
(``server/backends.servable_len``, ``server/serving``); the scheduler judges the twin's
requests by it (``Scheduler.can_ever_finish``), so the simulator rejects what a user of the
deployment would have seen refused. As in vLLM, the prompt and the output asked for are
judged together: a prompt must leave room for at least one output token.
"""

from __future__ import annotations


def servable_tokens(model_len: int | None, kv_tokens: int) -> int:
    """Prompt plus output that one request may reach: ``model_len`` (the model's context,
    or a lower ``--max-model-len``), at most ``kv_tokens`` (what the whole KV cache holds:
    no request grows past it, even alone). ``model_len`` None: no model context is known
    (a scheduler built without an executor's), and the cache alone bounds it."""
    if model_len is not None and model_len < 1:
        raise ValueError(f"model_len={model_len}: a model's context is at least 1 token")
    return kv_tokens if model_len is None else min(model_len, kv_tokens)


def fits_context(num_prompt_tokens: int, max_tokens: int, limit: int) -> bool:
    """Whether a prompt of ``num_prompt_tokens`` asking ``max_tokens`` of output is served
    under ``limit`` (``servable_tokens``): the server's 400 otherwise."""
    return num_prompt_tokens + max_tokens <= limit
