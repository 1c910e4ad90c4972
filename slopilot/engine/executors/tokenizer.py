"""A checkpoint's tokenizer.json plus its chat template, without transformers.

The chat template comes from ``chat_template.jinja`` (transformers 5 writes it there) or
from ``tokenizer_config.json``; it is rendered the way transformers renders it (sandboxed
Jinja, trim_blocks, lstrip_blocks, ``raise_exception``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from slopilot.engine.executors.token_bytes import TokenBytes

# From this length on, encode() takes long enough that holding the GIL would be felt.
_GIL_FREE_CHARS = 4096


class TokenizerError(ValueError):
    """The tokenizer files are missing or unusable; the message names the file and fix."""


def _raise(message: str) -> NoReturn:
    raise TemplateError(message)


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens as strings or {"content": ...} dicts.
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, *, chat_template: str | None,
                 bos_token: str | None, eos_token: str | None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = tokenizer.token_to_id(eos_token) if eos_token else None
        self._token_bytes = TokenBytes(tokenizer)

    @classmethod
    def from_dir(cls, path: Path) -> TextTokenizer:
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(
                f"{tok_file} is missing: the checkpoint needs a fast tokenizer file; "
                "save one with transformers' tokenizer.save_pretrained(dir)")
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust library raises a bare Exception
            raise TokenizerError(f"{tok_file} cannot be read: {exc}") from exc
        cfg: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                cfg = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as exc:
                raise TokenizerError(f"{cfg_file} is not valid JSON: {exc}") from exc
        template_file = path / "chat_template.jinja"
        template = (template_file.read_text() if template_file.is_file()
                    else cfg.get("chat_template"))
        if not isinstance(template, str):
            template = None
        return cls(tokenizer, chat_template=template,
                   bos_token=_token_text(cfg.get("bos_token")),
                   eos_token=_token_text(cfg.get("eos_token")))

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if len(text) < _GIL_FREE_CHARS:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)
        # The tokenizers library holds the GIL through encode() but releases it in the
        # batch calls, so a long prompt tokenized on a server thread leaves the event
        # loop (every other stream) running. The "fast" one also skips the character
        # offsets, whose teardown alone held the GIL ~0.1 s for a 1 MB prompt. Same ids.
        batch = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return list(batch[0].ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes the token stands for (``token_bytes.py``): of a piece of a
        character too, which ``decode`` reads as U+FFFD."""
        return self._token_bytes(token_id)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Render a chat as the prompt text the model was trained on.

        ``template_kwargs`` (a request's ``chat_template_kwargs``) are the template's own
        variables, such as Qwen3's ``enable_thinking``; one it does not read changes
        nothing. ``continue_final_message``: the text ends where the final message's does
        (no end-of-turn after it), for the model to go on with it (transformers' rule)."""
        if self.chat_template is None:
            raise TokenizerError(
                "this model has no chat template (neither chat_template.jinja nor a "
                "chat_template entry in tokenizer_config.json); use plain completions")
        given = dict(template_kwargs or {})
        taken = sorted(RENDER_VARIABLES & given.keys())
        if taken:
            raise TokenizerError(f"chat_template_kwargs.{taken[0]}: the server gives the "
                                 "template this variable itself; leave it out")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = _raise
        try:
            text = env.from_string(self.chat_template).render(
                **given, messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as exc:
            raise TokenizerError(f"the chat template refused the messages: {exc}") from exc
        if continue_final_message:
            return _continued(text, messages[-1].get("content") if messages else None)
        return text


RENDER_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token",
                              "raise_exception", "continue_final_message", "tools",
                              "documents", "chat_template", "tokenize"})
"""What the server gives a chat template (or refuses, as ``tools``): a request's
``chat_template_kwargs`` may not replace them (a kwarg named ``messages`` would render
another conversation than the one judged for length and logged)."""


def _continued(text: str, final: Any) -> str:
    """``text`` cut where the final message's content ends in it, as transformers cuts it
    (the last place the stripped content occurs)."""
    content = final.strip() if isinstance(final, str) else ""
    at = text.rfind(content) if content else -1
    if at < 0:
        raise TokenizerError("the final message cannot be continued: the chat template "
                             "does not write its text as given (or it is empty)")
    return text[:at + len(content)]
