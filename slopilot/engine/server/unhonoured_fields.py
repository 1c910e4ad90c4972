"""Request fields other OpenAI-compatible servers honour and this one cannot: refused
when they ask for something, never dropped in silence.

The request models ignore fields they do not know (an SDK extension meant for another
server does no harm), so these were ignored as well: a client asking vLLM's
``guided_json`` for JSON, OpenAI's legacy ``functions``, or ``min_p``, got an answer
made without them, a 200 and no word. Each is listed with the values that ask for
nothing (its default in vLLM or OpenAI): clients that write every field send those, and
are served. Names and defaults are vLLM's (``entrypoints/openai/protocol.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_UNSET: tuple[Any, ...] = (None, [], {}, "")

SAMPLING: Mapping[str, tuple[Any, ...]] = {
    "min_p": (None, 0),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": _UNSET,
    "prompt_logprobs": _UNSET,
    "allowed_token_ids": _UNSET,
    "bad_words": _UNSET,
    "logits_processors": _UNSET,
    "return_tokens_as_token_ids": (None, False),
    "guided_json": _UNSET,
    "guided_regex": _UNSET,
    "guided_choice": _UNSET,
    "guided_grammar": _UNSET,
    "structural_tag": _UNSET,
    "structured_outputs": _UNSET,
}
"""Both routes: vLLM's sampling and structured-output extensions."""

COMPLETIONS: Mapping[str, tuple[Any, ...]] = {
    **SAMPLING,
    "response_format": (None, {"type": "text"}),
    "add_special_tokens": (None, True),  # the prompt is encoded with them
    "prompt_embeds": _UNSET,
}

CHAT: Mapping[str, tuple[Any, ...]] = {
    **SAMPLING,
    "functions": _UNSET,  # OpenAI's legacy tools, refused as tools are
    "function_call": (None, "none", "auto"),
    "tool_choice": (None, "none", "auto"),  # without tools, auto chooses none
    "echo": (None, False),  # vLLM's: the last message in front of the answer
    "add_special_tokens": (None, False),  # the template's text is encoded without them
    "chat_template": _UNSET,
    "documents": _UNSET,
    "modalities": (None, ["text"]),
    "audio": _UNSET,
}


def first_unhonoured(data: Mapping[str, Any], fields: Mapping[str, tuple[Any, ...]]
                     ) -> tuple[str, Any] | None:
    """The first of ``fields`` that ``data`` sets to a value asking for something."""
    for name, no_op in fields.items():
        if name in data and not any(_same(data[name], v) for v in no_op):
            return name, data[name]
    return None


def _same(value: Any, no_op: Any) -> bool:
    # JSON's true is not 1 here: "length_penalty": true asks for something odd, and
    # "min_p": false is no number.
    return type(value) is type(no_op) and value == no_op if isinstance(value, bool) \
        or isinstance(no_op, bool) else value == no_op
