"""OpenAI request shapes at the HTTP edge: what a client sends, read and refused here.

Fields follow the OpenAI API; ``top_k``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``repetition_penalty``, ``cache_salt`` and ``priority`` are
extensions vLLM users know. Fields the engine cannot honour (tools, suffix, and those
of vLLM's and OpenAI's in ``unhonoured_fields.py``) are refused with a 400 when they ask
for anything, so a client never silently gets something other than what it asked for.
Every string must be valid UTF-8: a lone surrogate escape is a 400 naming its field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from slopilot.engine.executors.tokenizer import RENDER_VARIABLES
from slopilot.engine.json_items import surrogate_free
from slopilot.engine.server import unhonoured_fields

MAX_STOP_STRINGS = 16
# Every stop string is searched for at each token of each choice, on the event loop, for
# a time that grows with its length: 16 of 16,000 characters cost 49 us a token, of 1024
# 12 us, of 8 characters 5 us (measured in docs/operations.md, beside --max-body-mb).
MAX_STOP_CHARS = 1024
MAX_CHOICES = 16  # n, and n times the number of prompts in one completions request
INT64 = 2**63 - 1
# Token ids as logit_bias keys: no vocabulary has 10**10 entries.
MAX_TOKEN_ID_DIGITS = 10
_TOKEN_KEY = re.compile(f"[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}")
_TOKEN_KEYS = re.compile(f"{_TOKEN_KEY.pattern}(?:,{_TOKEN_KEY.pattern})*+")
"""Keys joined by commas, where none holds a comma."""


class FieldError(ValueError):
    """A refusal raised before the fields are parsed, naming the field at ``path``
    (the error handler makes it the error's ``param``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class UnencodableText(FieldError):
    """A string in the body that has no UTF-8 form (a lone surrogate such as \\ud800)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, f"{path} holds a lone surrogate (an unpaired "
                         "\\ud800-\\udfff escape), which is not text: send valid UTF-8")


class UnhonouredField(FieldError):
    """A field other servers honour and this one cannot, set to ask for something."""

    def __init__(self, name: str, value: Any) -> None:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:40] + "..."
        super().__init__(name, f"{name}: this server cannot honour {name}={shown}, and "
                         "serving the request without it would answer something other "
                         "than what was asked: leave it out, or send it to a server that "
                         "supports it")


def _first_unencodable(value: Any, path: str) -> str | None:
    """The dotted path of the first string in ``value`` that cannot be UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_unencodable(key, path) or _first_unencodable(
                item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _first_unencodable(item, f"{path}.{i}")
            if found is not None:
                return found
    return None


class _NullIsDefault(BaseModel):
    """A field with a default, sent as JSON null, takes its default: the OpenAI API marks
    these fields nullable and vLLM reads null so, and clients that write every field,
    set or not, send ``"n": null``. A required field sent as null is still refused."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_to_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields
                or fields[k].is_required()}


class StreamOptions(BaseModel):
    """What a stream says of its token usage, as vLLM's ``StreamOptions`` reads it.

    Once given, ``include_usage`` is true unless it says otherwise; null is false, not
    the default (vLLM tests the value, and null is falsy there), so these fields are
    not ``_NullIsDefault``'s. ``continuous_usage_stats`` (a vLLM extension) puts each
    chunk's usage on it, and needs ``include_usage``."""

    # Unknown keys are kept: options that say anything at all need stream=true.
    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False

    @property
    def given(self) -> bool:
        """Whether the options say anything (vLLM refuses only such options without a
        stream: an empty object passes)."""
        return bool(self.model_fields_set or self.model_extra)


class _GenerationFields(_NullIsDefault):
    """Fields shared by completions and chat completions."""

    # Unknown fields are ignored, as OpenAI-compatible servers do for SDK extensions.
    # NaN and Infinity, which Python's JSON reader takes and JSON has not, are named as
    # not finite (a NaN temperature was told it should be at most 2).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 disables it (extension)")
    seed: int | None = Field(None, ge=-INT64, le=INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    ignore_eos: bool = False
    min_tokens: int = Field(
        0, ge=0, description="No EOS, stop token id or stop string ends the output before "
        "this many tokens (extension, as in vLLM)")
    priority: int | str | None = Field(
        None, description="0/1/2 or p0/p1/p2 (extension); else the x-slopilot-priority "
        "header; default p1")
    user: str | None = None
    return_token_ids: bool = Field(
        False, description="Add the prompt's and the output's token ids (non-streaming; "
        "extension, as in vLLM)")
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(
        1.0, gt=0, le=10, description="Divides the logits of tokens already in the prompt "
        "or the output (extension, as in vLLM); 1 disables it")
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) to a bias in [-100, 100]")
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="Prefix-cache blocks are shared "
        "only between requests with the same salt (extension, as in vLLM)")

    # Fields other servers honour and this one cannot (unhonoured_fields.py), per route.
    _unhonoured: ClassVar[Mapping[str, tuple[Any, ...]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        # Before field parsing, so the path names the field whatever its type turns out.
        # A walk of every value in Python (3.4 s for 5.5 million of them, on the event
        # loop): skipped where the raw bytes were scanned whole and show no surrogate.
        path = None if surrogate_free() else _first_unencodable(data, "")
        if path is not None:
            raise UnencodableText(path or "the body")
        if isinstance(data, dict):
            found = unhonoured_fields.first_unhonoured(data, cls._unhonoured)
            if found is not None:
                raise UnhonouredField(*found)
        return data

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_not_bool(cls, value: Any) -> Any:
        # pydantic reads JSON's true and false as 1 and 0 for an int, and 0 is P0, the
        # most urgent class: a client sending "priority": false meant anything but that.
        if isinstance(value, bool):
            raise ValueError(f"{str(value).lower()} is not a class; use 0, 1, 2, p0, p1, "
                             "p2, realtime, standard or batch")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> str | list[str] | None:
        items = [stop] if isinstance(stop, str) else stop or []
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"{len(items)} stop strings: at most {MAX_STOP_STRINGS} allowed")
        if any(not s for s in items):
            raise ValueError("a stop string is empty; remove it")
        longest = max(len(s) for s in items) if items else 0
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string of {longest} characters: at most "
                             f"{MAX_STOP_CHARS} characters each; shorten it (its last "
                             f"{MAX_STOP_CHARS} match wherever the whole of it would)")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if not value:
            return value
        # Checked whole at C speed first (a key per vocabulary token, one by one in
        # Python, held the event loop 50 ms); one by one only to name the bad one.
        keys = ",".join(value)
        if keys.count(",") == len(value) - 1 and _TOKEN_KEYS.fullmatch(keys) \
                and min(value.values()) >= -100 and max(value.values()) <= 100:
            return value
        for key, bias in value.items():
            # ASCII digits only, and few of them: str.isdigit() passes "²" (int() then
            # raises) and "٣" (int() reads 3), and int() refuses over 4300 digits.
            if not _TOKEN_KEY.fullmatch(key):
                shown = key if len(key) <= 20 else key[:20] + "..."
                raise ValueError(f"{shown!r} is not a token id; keys are token ids written "
                                 f"in ASCII digits (at most {MAX_TOKEN_ID_DIGITS})")
            if not -100 <= bias <= 100:
                raise ValueError(f"{key}: {bias} is outside [-100, 100]")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _GenerationFields:
        if self.stream_options is not None and self.stream_options.given and not self.stream:
            raise FieldError("stream_options", "stream_options: only allowed with "
                             "stream=true: send stream=true, or leave stream_options out")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        """The stream ends with a chunk of the request's usage (and no choices)."""
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Each chunk carries its choice's usage so far (``continuous_usage_stats``)."""
        return self.include_usage and bool(self.stream_options
                                           and self.stream_options.continuous_usage_stats)

    @property
    def bias(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(k), v) for k, v in (self.logit_bias or {}).items())


class CompletionRequest(_GenerationFields):
    _unhonoured = unhonoured_fields.COMPLETIONS

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        ..., description="Text or token ids; a list of them is a batch, one choice set "
        "per prompt")
    echo: bool = Field(False, description="Put the prompt in front of each choice's text "
                       "(and its logprobs in front of theirs)")
    logprobs: int | None = Field(
        None, ge=0, le=20, description="Logprobs of each token and of this many top "
        "alternatives")
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, prompt: Any) -> Any:
        items = prompt if isinstance(prompt, list) and prompt and isinstance(
            prompt[0], (str, list)) else [prompt]
        for item in items:
            if isinstance(item, list) and not item:
                raise ValueError("the prompt is empty")
        if not items or (isinstance(prompt, list) and not prompt):
            raise ValueError("the prompt is empty")
        return prompt

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix is not supported")
        return suffix

    @field_validator("best_of")
    @classmethod
    def _best_of_n(cls, best_of: int | None, info: ValidationInfo) -> int | None:
        # Each choice is its own sample: best_of = n is what is served. Fewer cannot make
        # n choices (vLLM and OpenAI refuse best_of < n), more would rank candidates.
        n = info.data.get("n", 1)
        if best_of is not None and best_of != n:
            raise ValueError(f"best_of={best_of} with n={n}: only best_of = n is supported")
        return best_of

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.n * len(self.prompts) > MAX_CHOICES:
            raise FieldError("n", f"n: {len(self.prompts)} prompts x n={self.n}: at most "
                             f"{MAX_CHOICES} choices per request; send several requests")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The batch: every prompt, as text or token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return list(p)
        return [p]  # type: ignore[list-item]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            # As vLLM, SGLang and TensorRT-LLM join them: parts are not glued into a word.
            return "\n".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_GenerationFields):
    _unhonoured = unhonoured_fields.CHAT

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = Field(True, description="End the prompt with the "
                                        "template's start of an assistant turn (vLLM's)")
    continue_final_message: bool = Field(False, description="End the prompt where the "
                                         "final message's text ends, for the model to go "
                                         "on with it (vLLM's; needs add_generation_prompt "
                                         "false)")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Variables for the chat template, such as enable_thinking "
        "(vLLM's); one the template does not read changes nothing")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_the_servers_own(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(RENDER_VARIABLES & (kwargs or {}).keys())
        if taken:
            raise FieldError("chat_template_kwargs", f"chat_template_kwargs.{taken[0]}: the "
                             "server gives the template this variable itself; leave it out")
        return kwargs

    @model_validator(mode="after")
    def _unsupported(self) -> ChatCompletionRequest:
        # Each refusal names its field (the error's ``param``): a plain ValueError here,
        # after the fields are parsed, belongs to no field.
        if self.tools:
            raise UnhonouredField("tools", self.tools)
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError("continue_final_message", "continue_final_message: the final "
                             "message cannot be continued after a generation prompt: set "
                             "add_generation_prompt to false with it")
        if self.response_format not in (None, {"type": "text"}):
            raise UnhonouredField("response_format", self.response_format)
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs: needs logprobs=true: send "
                             "logprobs=true with it, or leave top_logprobs out")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The field ``requested_max_tokens`` came from, for errors to name as sent."""
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
