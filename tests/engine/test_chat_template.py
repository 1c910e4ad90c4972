"""A chat rendered with its template the way vLLM renders it (transformers' rules): the
generation prompt on or off, the final message continued, and the request's
``chat_template_kwargs`` as the template's variables (Qwen3's ``enable_thinking``)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models

from slopilot.engine.executors.tokenizer import TextTokenizer, TokenizerError

# ChatML with a thinking switch, as Qwen3's template has one.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
CHAT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is"}]


def _tok(template: str = TEMPLATE) -> TextTokenizer:
    return TextTokenizer(Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                         chat_template=template, bos_token=None, eos_token=None)


def test_the_template_reads_the_requests_kwargs() -> None:
    tok = _tok()
    plain = tok.apply_chat_template(CHAT[:1])
    off = tok.apply_chat_template(CHAT[:1], template_kwargs={"enable_thinking": False})
    assert plain.endswith("<|im_start|>assistant\n")
    assert off == plain + "<think>\n\n</think>\n\n"
    # A variable the template does not read changes nothing, as in vLLM.
    assert tok.apply_chat_template(CHAT[:1], template_kwargs={"unused": 1}) == plain


def test_no_generation_prompt() -> None:
    assert _tok().apply_chat_template(CHAT[:1], add_generation_prompt=False) \
        == "<|im_start|>user\n2+2?<|im_end|>\n"


def test_the_final_message_is_continued_where_its_text_ends() -> None:
    rendered = _tok().apply_chat_template(CHAT, add_generation_prompt=False,
                                          continue_final_message=True)
    assert rendered == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nIt is"


def test_a_final_message_the_template_does_not_write_cannot_be_continued() -> None:
    tok = _tok("{% for m in messages %}{{ m.role }}{% endfor %}")
    with pytest.raises(TokenizerError, match="cannot be continued"):
        tok.apply_chat_template(CHAT, add_generation_prompt=False,
                                continue_final_message=True)


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "bos_token",
                                  "raise_exception"])
def test_a_kwarg_may_not_replace_what_the_server_gives_the_template(name: str) -> None:
    with pytest.raises(TokenizerError, match=f"chat_template_kwargs.{name}"):
        _tok().apply_chat_template(CHAT[:1], template_kwargs={name: []})
