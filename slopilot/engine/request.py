"""Request lifecycle, priority classes and stop conditions.

A request moves WAITING -> RUNNING (prefilling, then decoding) -> FINISHED_*; it may
fall back to PREEMPTED_RECOMPUTE or PREEMPTED_SWAPPED and rejoin the waiting queue.
The status enum is ordered so "is it finished" is one comparison.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Priority(enum.IntEnum):
    """Lower value is served first: P0 realtime, P1 standard, P2 batch."""

    P0 = 0
    P1 = 1
    P2 = 2

    @property
    def label(self) -> str:
        return f"p{self.value}"

    @classmethod
    def parse(cls, value: object) -> Priority:
        """Accept 0/1/2, "p0".."p2", "P0".., "realtime"/"standard"/"batch"."""
        if isinstance(value, Priority):
            return value
        aliases = {"realtime": 0, "standard": 1, "batch": 2}
        text = str(value).strip().lower()
        text = str(aliases.get(text, text)).removeprefix("p")
        if text in ("0", "1", "2"):
            return cls(int(text))
        # Cut short: a client's value of megabytes is not worth writing back whole.
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:40] + "..."
        raise ValueError(
            f"priority {shown} is not a class; use 0, 1, 2, p0, p1, p2, "
            "realtime, standard or batch")


class RequestStatus(enum.IntEnum):
    WAITING = 0
    PREEMPTED_RECOMPUTE = 1
    PREEMPTED_SWAPPED = 2
    RUNNING = 3
    # Everything above RUNNING is final.
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.RUNNING


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's log-probabilities, from the model's raw logits (log-softmax)."""

    token_id: int
    logprob: float
    # 1 is the most likely token at this position.
    rank: int
    # The most likely tokens, best first: (token id, logprob).
    top: tuple[tuple[int, float], ...] = ()


class RequestPhase(enum.StrEnum):
    """Where a request is, for people and metrics: the status plus its progress.

    RUNNING splits into prefilling (prompt, or a recomputed history, still being fed in
    chunks) and decoding (one token per iteration).
    """

    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    PREEMPTED_RECOMPUTE = "preempted_recompute"
    PREEMPTED_SWAPPED = "preempted_swapped"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


# Most top logprobs one token may carry (vLLM's default max_logprobs).
MAX_LOGPROBS = 20


class SamplingError(ValueError):
    """A sampling parameter out of range; ``field`` names it, as the request writes it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Stop conditions and sampling settings; validated once at the edge.

    Penalties follow vLLM (and OpenAI): ``presence_penalty`` and ``frequency_penalty``
    subtract from the logits of tokens already generated (once, and per occurrence);
    ``repetition_penalty`` divides positive logits (multiplies negative ones) of tokens
    in the prompt or the output, as transformers' RepetitionPenaltyLogitsProcessor does;
    ``logit_bias`` adds to chosen tokens' logits. ``logprobs`` asks for the sampled
    token's log-probability and that many top alternatives (from the model's raw
    logits, before any of the above); ``prompt_logprobs`` the same for prompt tokens.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    # A set: every new token is checked against it on the engine thread, and a client
    # may send a long list (repeats included) that a tuple would make a scan per token.
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    @property
    def has_penalties(self) -> bool:
        """Whether the logits need the request's tokens before sampling."""
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise SamplingError("max_tokens",
                                f"max_tokens={self.max_tokens}: must be at least 1")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingError("min_tokens", f"min_tokens={self.min_tokens}: must be in "
                                f"[0, max_tokens={self.max_tokens}]")
        if self.temperature < 0:
            raise SamplingError("temperature",
                                f"temperature={self.temperature}: must be >= 0")
        if self.top_k < 0:
            raise SamplingError("top_k",
                                f"top_k={self.top_k}: must be >= 0 (0 disables it)")
        if not 0 < self.top_p <= 1:
            raise SamplingError("top_p", f"top_p={self.top_p}: must be in (0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise SamplingError(name, f"{name}={value}: must be in [-2, 2]")
        if not 0 < self.repetition_penalty <= 10:
            raise SamplingError("repetition_penalty",
                                f"repetition_penalty={self.repetition_penalty}: must be in "
                                "(0, 10]; 1 disables it")
        for token, bias in self.logit_bias:
            if token < 0 or not -100 <= bias <= 100:
                raise SamplingError("logit_bias", f"logit_bias {token}: {bias}: token ids "
                                    "are >= 0 and biases in [-100, 100]")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise SamplingError(name, f"{name}={value}: must be in [0, {MAX_LOGPROBS}]")


@dataclass(slots=True, eq=False)
class Request:
    """One generation request and its progress. Mutated only by the scheduler."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # An int or a name is accepted and turned into a Priority (so priority=0 is P0).
    priority: Priority = Priority.P1
    # When the request reached the engine's front door (the HTTP server stamps it before
    # parsing the body); TTFT and end-to-end latency count from here.
    arrival_time: float = 0.0
    eos_token_id: int | None = None
    # Prefix-cache blocks are shared only between requests with the same salt (tenants).
    cache_salt: str | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Filled only when sampling asks for them: one entry per output token, and one per
    # prompt token from the second on (the first has no context to be predicted from).
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # Tokens whose KV is in the cache (or would be, once this iteration runs).
    num_computed_tokens: int = 0
    # Tokens found in the prefix cache at the last admission (not recomputed).
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # Arrival order, assigned by the scheduler: the FCFS tie-break inside a class.
    seq_no: int = 0
    # Timestamps the engine loop fills in (engine clock: virtual or monotonic).
    # queued_time: the engine took it (after parsing and tokenizing): queue time counts
    # from here, so the queue/prefill split is the engine's own.
    queued_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    # len(prompt) + len(outputs), kept in step by append_output (a plain attribute:
    # the scheduler reads it for every running request on every pass).
    num_tokens: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.priority) is not Priority:
            self.priority = Priority.parse(self.priority)
        self.num_tokens = len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def append_output(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.num_tokens += 1

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status > RequestStatus.RUNNING

    @property
    def phase(self) -> RequestPhase:
        status = self.status
        if status is RequestStatus.RUNNING:
            if self.num_tokens - self.num_computed_tokens > 1:
                return RequestPhase.PREFILLING
            return RequestPhase.DECODING
        if status > RequestStatus.RUNNING:
            return RequestPhase.FINISHED
        return {RequestStatus.WAITING: RequestPhase.WAITING,
                RequestStatus.PREEMPTED_RECOMPUTE: RequestPhase.PREEMPTED_RECOMPUTE,
                RequestStatus.PREEMPTED_SWAPPED: RequestPhase.PREEMPTED_SWAPPED}[status]

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASON.get(self.status)

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[pos] if pos < n else self.output_token_ids[pos - n]

    def token_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]

    def check_stop(self, token_id: int) -> RequestStatus | None:
        """The finished status that ``token_id`` (just appended) causes, if any."""
        params = self.sampling
        n_out = len(self.output_token_ids)
        if n_out >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if n_out < params.min_tokens:
            return None
        if not params.ignore_eos and token_id == self.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        return None
