"""From a validated OpenAI request to engine requests, and their admission.

``prepare`` checks what only the server can check (token ids against the vocabulary,
the context length, the class against the client's grant, logit-bias ids) and builds one
engine ``Request`` per choice: every prompt of a batch, ``n`` times. It tokenizes and
renders the chat template, so the server runs it on a worker thread, not on the event
loop (unless the prompt is so short that the thread hop would cost more).
``submit`` admits a request's choices all or none, mapping the scheduler's refusals to
HTTP statuses; ``refused_for_load`` is the 429 of choices turned away for load, at the
door or displaced later by a more urgent request. ``responses.py`` turns their token
streams into OpenAI responses.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from slopilot.engine.clients import ClientClasses, ClientRefused, Served
from slopilot.engine.context_limit import fits_context
from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority, Request, SamplingError, SamplingParams
from slopilot.engine.scheduler import PromptTooLongError, QueueFullError
from slopilot.engine.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineDrainingError,
    RequestStream,
    TooManyChoicesError,
)
from slopilot.engine.server.backends import Backend
from slopilot.engine.server.client_gate import GrantRefusal
from slopilot.engine.server.errors import APIError
from slopilot.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from slopilot.engine.slo import SLOSpec

PRIORITY_HEADER = "x-slopilot-priority"
RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""Which try of one call a request is (0: the first), as the openai SDKs send it: they
retry a 429 twice by default, and each retry of a call turned away is not another
client turned away."""
UNNAMED_CLASS = Priority.P1
"""The class a request naming none (neither its body nor ``PRIORITY_HEADER``) is served
in where no client grants decide (with them: its grant's default class)."""
# Below this many characters of prompt text, tokenizing takes well under a millisecond:
# cheaper on the event loop than the hop to a tokenizer thread and back.
INLINE_PREPARE_CHARS = 2048
# The OpenAI completions default; chat defaults to whatever context is left.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass
class Prompt:
    token_ids: list[int]
    # The prompt as text, for echo (a token-id prompt is decoded once, when asked).
    text: str | None


@dataclass
class Choice:
    index: int
    prompt: Prompt
    request: Request


@dataclass
class Prepared:
    request_id: str
    prompts: list[Prompt]
    choices: list[Choice]
    stop: list[str]
    # Ids whose text is not part of the output when they end a request.
    stop_ids: frozenset[int]
    chat: bool
    include_usage: bool
    stream: bool
    return_token_ids: bool = False
    echo: bool = False
    # Top alternatives per token when logprobs are asked for, else None.
    logprobs: int | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # Its client retries a call (RETRY_COUNT_HEADER above 0).
    retry: bool = False
    # Whom it is served for and in which class, where client grants decide (else None).
    served: Served | None = None
    # Each chunk carries its choice's usage so far (stream_options.continuous_usage_stats).
    continuous_usage: bool = False


def is_retry(headers: Mapping[str, str]) -> bool:
    """Whether the client says this request retries a call: a count above 0. Anything
    else (no header, 0, a value that is no count) is a first try, counted as one."""
    raw = headers.get(RETRY_COUNT_HEADER, "").strip()
    # Read as digits, not int(): a count of 5,000 digits would raise (int's digit limit).
    return raw.isascii() and raw.isdigit() and raw.strip("0") != ""


def one_priority_header(values: list[str]) -> None:
    """Refuses a request that gives the priority header more than once: read first, a
    gateway that appends its own class rather than replacing the client's was overridden
    by it (the values joined in one, ``p0, p2``, are refused as no class already)."""
    if len(values) > 1:
        raise APIError(400, f"{PRIORITY_HEADER} is given {len(values)} times: give it "
                       "once (a gateway setting the class should replace the client's)",
                       param=PRIORITY_HEADER)


def _priority(body_value: int | str | None, headers: Mapping[str, str],
              clients: ClientClasses | None) -> tuple[Priority, Served | None]:
    """The class a request is served in (the body's ``priority`` over the header, P1 if
    neither names one: ``UNNAMED_CLASS``), and for whom where ``clients`` grant the
    classes."""
    raw = body_value if body_value is not None else headers.get(PRIORITY_HEADER)
    param = "priority" if body_value is not None else PRIORITY_HEADER
    named = None
    if raw is not None:
        try:
            named = Priority.parse(raw)
        except ValueError as exc:
            raise APIError(400, str(exc), param=param) from None
    if clients is None:
        return (UNNAMED_CLASS if named is None else named), None
    try:
        served = clients.serve(headers.get("authorization"), named)
    except ClientRefused as exc:
        raise GrantRefusal(exc, param) from None
    return served.priority, served


def _prompts(backend: Backend, body: CompletionRequest | ChatCompletionRequest
             ) -> list[Prompt]:
    tok = backend.tokenizer
    if isinstance(body, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = tok.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                template_kwargs=body.chat_template_kwargs)
        except ValueError as exc:  # TokenizerError: no template, or it refused
            param = ("chat_template_kwargs" if str(exc).startswith("chat_template_kwargs.")
                     else "messages")
            raise APIError(400, str(exc), param=param) from None
        # On the rendered text: a template may drop messages or add to them.
        _check_text_fits(backend, text, "messages")
        ids = tok.encode(text, add_special_tokens=False)
        _check_encoded_ids(backend, ids, "messages")
        return [Prompt(ids, None)]
    out = []
    vocab = backend.vocab_size
    for prompt in body.prompts:
        if isinstance(prompt, str):
            _check_text_fits(backend, prompt, "prompt")
            ids = tok.encode(prompt)
            _check_encoded_ids(backend, ids, "prompt")
            out.append(Prompt(ids, prompt))
            continue
        bad = next((t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})",
                           param="prompt")
        out.append(Prompt(list(prompt), tok.decode(prompt) if body.echo else None))
    return out


def _check_encoded_ids(backend: Backend, ids: list[int], param: str) -> None:
    """Refuse a text whose tokens include one the model has no row for: a token added
    to the tokenizer and not to the model (its text, typed into a prompt, encodes to
    it). Fed to the engine, it failed the engine for every request."""
    if not backend.tokenizer_exceeds_model:
        return
    vocab = backend.vocab_size
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        text = backend.tokenizer.decode([bad], skip_special_tokens=False)
        raise APIError(400, f"the {param} encodes to token id {bad} ({text!r}), which "
                       f"this model has no embedding for: its vocabulary is [0, {vocab}), "
                       "the tokenizer's is larger; remove that text", param=param)


def context_of(backend: Backend) -> str:
    """The context limit in words: the model's, or the KV cache's where that is less (a
    client is told which it ran into, and so whether another server would take it)."""
    if backend.kv_limited:
        return (f"this server's KV cache holds {backend.max_model_len} tokens (less than "
                "the model's context)")
    return f"this model's context is {backend.max_model_len} tokens"


def _check_text_fits(backend: Backend, text: str, param: str) -> None:
    """Refuse, untokenized, a text that no tokenization fits into the context.

    A token stands for at most ``backend.max_token_bytes`` bytes, so a text of more than
    (context - 1) times that needs more tokens than the context holds (one is left for
    the output). Tokenizing it first cost seconds and gigabytes for the same answer.
    """
    per_token = backend.max_token_bytes
    if per_token is None:
        return
    limit = backend.max_model_len
    most = (limit - 1) * per_token
    chars = len(text)
    if 4 * chars <= most:  # UTF-8 takes at most 4 bytes a character
        return
    # Bytes are at least the characters: counting them is needed only when near.
    size = chars if chars > most else len(text.encode())
    if size > most:
        raise APIError(400, f"the prompt is {'at least ' if size == chars else ''}{size} "
                       f"bytes of UTF-8 text; {context_of(backend)} and a "
                       f"token stands for at most {per_token} bytes, so no prompt over "
                       f"{most} bytes fits: shorten the prompt", param=param,
                       code="context_length_exceeded")


def _check_length(backend: Backend, prompt: Prompt, param: str) -> None:
    if not prompt.token_ids:
        raise APIError(400, "the prompt is empty (it encodes to no tokens)", param=param)
    limit = backend.max_model_len
    if len(prompt.token_ids) >= limit:
        # 400, as OpenAI and vLLM answer: the SDK raises BadRequestError on it.
        raise APIError(400, f"the prompt has {len(prompt.token_ids)} tokens; "
                       f"{context_of(backend)}, which must also hold the output: "
                       "shorten the prompt", param=param, code="context_length_exceeded")


def _max_tokens(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
                num_prompt: int) -> int:
    chat = isinstance(body, ChatCompletionRequest)
    asked = body.requested_max_tokens if isinstance(body, ChatCompletionRequest) \
        else body.max_tokens
    param = _max_tokens_param(body)
    limit = backend.max_model_len
    max_tokens = asked if asked is not None else (
        limit - num_prompt if chat else COMPLETIONS_DEFAULT_MAX_TOKENS)
    if not fits_context(num_prompt, max_tokens, limit):
        raise APIError(400, f"{context_of(backend)}; the prompt has "
                       f"{num_prompt} and {param} asks for {max_tokens}: lower {param} "
                       f"to at most {limit - num_prompt}", param=param,
                       code="context_length_exceeded")
    return max_tokens


def _max_tokens_param(body: CompletionRequest | ChatCompletionRequest) -> str:
    return body.max_tokens_param if isinstance(body, ChatCompletionRequest) else "max_tokens"


def _logprobs(body: CompletionRequest | ChatCompletionRequest) -> int | None:
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def _bias(backend: Backend, body: CompletionRequest | ChatCompletionRequest
          ) -> tuple[tuple[int, float], ...]:
    """The request's logit bias, read and checked once for all its choices (a full
    vocabulary's, read again per choice, held the loop 1.26 s for 16 choices)."""
    vocab = backend.vocab_size
    bias = body.bias
    if bias and max(t for t, _ in bias) >= vocab:
        bad = next(t for t, _ in bias if t >= vocab)
        raise APIError(400, f"logit_bias names token {bad}, outside the vocabulary "
                       f"[0, {vocab})", param="logit_bias")
    return bias


def _sampling(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
              max_tokens: int, seed: int | None,
              bias: tuple[tuple[int, float], ...]) -> SamplingParams:
    eos = backend.eos_token_ids
    vocab = backend.vocab_size
    # An id outside the vocabulary can never be sampled: a stop on it is a typo.
    bad = next((t for t in body.stop_token_ids or () if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"stop_token_ids names token {bad}, outside the vocabulary "
                       f"[0, {vocab})", param="stop_token_ids")
    if body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens={body.min_tokens} is above "
                       f"{_max_tokens_param(body)}={max_tokens}: lower min_tokens",
                       param="min_tokens")
    logprobs = _logprobs(body)
    echo = isinstance(body, CompletionRequest) and body.echo
    try:
        return SamplingParams(
            max_tokens=max_tokens, min_tokens=body.min_tokens,
            stop_token_ids=frozenset(body.stop_token_ids or ())
            | frozenset(() if body.ignore_eos else eos[1:]),
            ignore_eos=body.ignore_eos,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_k=body.top_k if body.top_k is not None and body.top_k > 0 else 0,
            top_p=1.0 if body.top_p is None else body.top_p, seed=seed,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty, logit_bias=bias,
            logprobs=logprobs, prompt_logprobs=logprobs if echo else None)
    except ValueError as exc:  # SamplingParams' own checks name their field
        field = exc.field if isinstance(exc, SamplingError) else None
        raise APIError(400, str(exc), param=field) from None


def text_size(body: CompletionRequest | ChatCompletionRequest) -> int:
    """Characters (or token ids) ``prepare`` would have to tokenize or check: its
    prompts, and each choice's logit bias and stop token ids."""
    ids = len(body.logit_bias or ()) + len(body.stop_token_ids or ())
    if isinstance(body, ChatCompletionRequest):
        return sum(len(m.text()) for m in body.messages) + body.n * ids
    prompts = body.prompts
    return sum(len(p) for p in prompts) + len(prompts) * body.n * ids


def model_not_found(backend: Backend, model: str) -> APIError:
    """The 404 for a model this server does not serve (a request's ``model``, or the id
    of GET /v1/models/{id})."""
    shown = model if len(model) <= 80 else model[:80] + "..."
    return APIError(404, f"model {shown!r} is not served here; this server serves "
                    f"{backend.served_model_name!r}", param="model", code="model_not_found")


def prepare(backend: Backend, body: CompletionRequest | ChatCompletionRequest,
            headers: Mapping[str, str], arrival_time: float,
            clients: ClientClasses | None = None) -> Prepared:
    """Every choice's engine request; runs on a worker thread (it tokenizes).

    ``clients``: the grants the request's class must be within (GrantRefusal if not);
    None: the class is the client's to name."""
    chat = isinstance(body, ChatCompletionRequest)
    if body.model is not None and body.model != backend.served_model_name:
        raise model_not_found(backend, body.model)
    priority, served = _priority(body.priority, headers, clients)
    param = "messages" if chat else "prompt"
    prompts = _prompts(backend, body)
    for prompt in prompts:
        _check_length(backend, prompt, param)
    base = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    eos = backend.eos_token_ids
    n = body.n
    bias = _bias(backend, body)
    choices: list[Choice] = []
    for prompt in prompts:
        max_tokens = _max_tokens(backend, body, len(prompt.token_ids))
        for i in range(n):
            # As in vLLM: choice i of a seeded request draws with seed + i.
            seed = None if body.seed is None else body.seed + i
            index = len(choices)
            rid = base if len(prompts) * n == 1 else f"{base}-{index}"
            req = Request(rid, list(prompt.token_ids),
                          _sampling(backend, body, max_tokens, seed, bias),
                          priority=priority,
                          arrival_time=arrival_time, eos_token_id=eos[0] if eos else None,
                          cache_salt=body.cache_salt)
            choices.append(Choice(index, prompt, req))
    echo = isinstance(body, CompletionRequest) and body.echo
    return Prepared(base, prompts, choices, body.stop_strings,
                    frozenset(body.stop_token_ids or ()) | frozenset(eos), chat,
                    body.include_usage, body.stream, body.return_token_ids, echo,
                    _logprobs(body), retry=is_retry(headers), served=served,
                    continuous_usage=body.continuous_usage)


async def submit(engine: AsyncEngine, prep: Prepared, metrics: EngineMetrics,
                 slo: SLOSpec | None) -> list[RequestStream]:
    """Admit every choice, or none (one step of the engine thread). Choices turned away
    for load are counted, each a miss of its class's ``slo`` (taken at arrival). A retry
    let in is counted as one once it is settled (``Delivery``): until its first output
    it may still be displaced, and then it is a retry turned away."""
    try:
        streams = await engine.add_requests([c.request for c in prep.choices])
    except TooManyChoicesError as exc:
        n = len(prep.choices) // len(prep.prompts)
        batch = f" x {len(prep.prompts)} prompts" if len(prep.prompts) > 1 else ""
        raise APIError(400, f"n={n}{batch}: {exc}; lower n or send several requests",
                       param="n") from None
    except QueueFullError as exc:
        _arrived(prep, metrics)  # offered, if turned away: the load's bursts are in it
        raise refused_for_load(engine, prep, metrics, slo, exc) from None
    except PromptTooLongError as exc:
        raise APIError(400, str(exc), code="context_length_exceeded",
                       param="messages" if prep.chat else "prompt") from None
    except EngineDrainingError as exc:
        raise APIError(503, str(exc), code="draining") from None
    except EngineDeadError as exc:
        raise APIError(500, str(exc), code="engine_dead") from None
    _arrived(prep, metrics)
    return streams


def _arrived(prep: Prepared, metrics: EngineMetrics) -> None:
    """Each choice counted as offered (``metric_names.ARRIVED``): here, once the engine
    let it in or turned it away for load, so a prompt that never fits (a client's 400)
    is no arrival, and one displaced later is not counted again. A retry is its call's,
    counted at its first try."""
    if not prep.retry:
        for c in prep.choices:
            metrics.count_arrived(c.request.priority)


def refused_for_load(engine: AsyncEngine, prep: Prepared, metrics: EngineMetrics,
                     slo: SLOSpec | None, exc: QueueFullError) -> APIError:
    """The 429 for choices turned away for load: at the door (a full queue), or later,
    before any started, displaced by a more urgent request (``DisplacedError``). Each is
    counted a refusal of its own class, a miss of its class's ``slo`` (taken at arrival),
    or, for a retry, apart (``EngineMetrics.count_refused``)."""
    for c in prep.choices:
        metrics.count_refused(c.request.priority, slo, retry=prep.retry)
    return APIError(429, str(exc), code="queue_full",
                    headers={"Retry-After": str(engine.retry_after_s())})
