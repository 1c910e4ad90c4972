"""What the simulator is fed: request specs, the Workload protocol, synthetic tokens, class mix.

The simulator pulls ``initial()`` (arrivals known up front, in time order, possibly lazy)
and calls ``on_finish()`` for every finished request, ``on_rejected()`` for every refused
one; closed-loop workloads answer with follow-ups (the next turn of a chat session after a
think time, or a new session in its slot), open-loop ones with [].

The concrete workloads live next door: ``open_loop.OpenLoopWorkload`` (Poisson, gamma and
on/off arrivals, with phase shifts), ``sessions.SessionWorkload`` (fixed concurrency,
multi-turn chat sharing its history as a prefix) and ``trace.TraceWorkload`` (replay).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, overload, runtime_checkable

import numpy as np

from slopilot.engine.request import Priority

# Token ids below this are never generated: EOS, BOS and other specials live down there in
# every tokenizer we model, so a synthetic prompt or a placeholder output never stops early.
RESERVED_TOKEN_IDS = 10
# Small enough to be a valid id for every model profile's vocabulary (Llama-2 has 32000).
DEFAULT_VOCAB_SIZE = 32000


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the workload describes it; the simulator turns it into a ``Request``.

    ``max_tokens`` is the output length: the simulator sets ``ignore_eos`` so the request
    generates exactly that many tokens. ``session_id``/``turn`` let ``on_finish`` find the
    conversation a finished request belongs to (None/0 for open-loop requests).
    """

    arrival_time: float
    prompt_token_ids: Sequence[int]
    """A list, or a ``SyntheticPrompt`` whose tokens are drawn only when read."""
    max_tokens: int
    priority: Priority = Priority.P1
    session_id: int | None = None
    turn: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_time) and self.arrival_time >= 0):
            raise ValueError(f"arrival_time={self.arrival_time}: must be a finite time >= 0")
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids is empty: a request needs at least one token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens}: must be at least 1")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@runtime_checkable
class Workload(Protocol):
    """The simulator's source of requests."""

    def initial(self) -> Iterator[RequestSpec]:
        """Arrivals known up front, in non-decreasing ``arrival_time`` order.

        Each call starts over and yields the same specs (seeded), so a workload object can
        be replayed; it may be lazy, and the simulator should pull it as time advances.
        """
        ...

    def on_finish(self, spec: RequestSpec, all_token_ids: list[int],
                  now: float) -> list[RequestSpec]:
        """Follow-ups caused by ``spec`` finishing at ``now``, each arriving at or after ``now``.

        ``all_token_ids`` is the finished request's prompt plus its generated output; a
        chat session's next turn starts with it, so its history is a real shared prefix.
        """
        ...

    def on_rejected(self, spec: RequestSpec, now: float) -> list[RequestSpec]:
        """Follow-ups of ``spec`` refused at ``now`` (too long for the deployment, or a full
        queue): a chat user whose turn is refused starts a new conversation."""
        ...


class TokenSampler:
    """Synthetic token ids in ``[RESERVED_TOKEN_IDS, vocab_size)``: never EOS or a special."""

    def __init__(self, vocab_size: int = DEFAULT_VOCAB_SIZE) -> None:
        if vocab_size <= RESERVED_TOKEN_IDS + 1:
            raise ValueError(
                f"vocab_size={vocab_size}: must exceed the {RESERVED_TOKEN_IDS} reserved ids "
                f"by at least 2; use the model's vocabulary size (e.g. {DEFAULT_VOCAB_SIZE})")
        self.vocab_size = vocab_size

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        # Straight to ints: every prompt without a session is drawn here, and the narrow
        # copy sample_array makes for a held stream would be one more per request.
        ids: list[int] = rng.integers(RESERVED_TOKEN_IDS, self.vocab_size, n).tolist()
        return ids

    def sample_array(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``sample``'s ids (the same draws from ``rng``) in the narrowest unsigned dtype
        that holds the vocabulary: 2 bytes a token for 32,000 ids, where a list of
        Python ints costs ~40 (a stream held for a session's next turns)."""
        dtype = np.min_scalar_type(self.vocab_size - 1)
        return rng.integers(RESERVED_TOKEN_IDS, self.vocab_size, n).astype(dtype)


class SyntheticPrompt(Sequence[int]):
    """``n`` synthetic token ids, drawn by ``draw(n)`` on first read and kept; ``draw``
    is let go once drawn, so what it holds (a trace session's token stream) lives only as
    long as a prompt not yet drawn needs it.

    A trace gives lengths, and a mistaken or hostile one can give a length no deployment
    holds (300M tokens are gigabytes as a list): the simulator reads ``len()`` first and
    rejects a prompt that can never fit, as the engine would, without drawing it.
    """

    __slots__ = ("_draw", "_ids", "_n")

    def __init__(self, n: int, draw: Callable[[int], list[int]]) -> None:
        if n < 1:
            raise ValueError(f"n={n}: a prompt needs at least one token")
        self._n = n
        self._draw: Callable[[int], list[int]] | None = draw
        self._ids: list[int] | None = None

    def tokens(self) -> list[int]:
        if self._ids is None:
            assert self._draw is not None, "let go only once drawn"
            self._ids = self._draw(self._n)
            self._draw = None
        return self._ids

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.tokens()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.tokens())

    def __eq__(self, other: object) -> bool:
        # Equal to any sequence of the same ids, lists included (RequestSpec equality).
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._n and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable-by-drawing, like a list

    def __repr__(self) -> str:
        drawn = "drawn" if self._ids is not None else "not drawn"
        return f"SyntheticPrompt({self._n} tokens, {drawn})"


@dataclass(frozen=True, slots=True)
class ClassMix:
    """Share of requests (or sessions) per priority class; weights need not sum to 1."""

    weights: tuple[float, float, float] = (0.0, 1.0, 0.0)  # P0, P1, P2

    def __post_init__(self) -> None:
        if len(self.weights) != 3:
            raise ValueError(f"weights={self.weights}: give exactly three (P0, P1, P2)")
        if not all(math.isfinite(w) and w >= 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError(
                f"weights={self.weights}: each must be a finite number >= 0 and at least "
                "one must be positive, e.g. {p0: 0.1, p1: 0.6, p2: 0.3}")

    @classmethod
    def of(cls, mapping: Mapping[Priority, float]) -> ClassMix:
        return cls(tuple(float(mapping.get(p, 0.0)) for p in Priority))  # type: ignore[arg-type]

    @classmethod
    def only(cls, priority: Priority) -> ClassMix:
        return cls.of({priority: 1.0})

    @property
    def shares(self) -> dict[Priority, float]:
        weights = fitted(self.weights)
        total = sum(weights)
        return {p: w / total for p, w in zip(Priority, weights, strict=True)}

    def sample(self, rng: np.random.Generator) -> Priority:
        probs = np.asarray(fitted(self.weights), dtype=np.float64)
        return Priority(int(rng.choice(3, p=probs / probs.sum())))

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` classes at once, as ``Priority`` values (0 = P0)."""
        probs = np.asarray(fitted(self.weights), dtype=np.float64)
        return rng.choice(3, size=n, p=probs / probs.sum())


def fitted(weights: Sequence[float]) -> Sequence[float]:
    """``weights`` whose sum a float holds: as given, or over their largest where it
    would not (each finite, two of 1e308 sum to inf, and every share read 0 or NaN)."""
    if math.isinf(sum(weights)):
        top = max(weights)
        return [w / top for w in weights]
    # Unscaled: a seeded workload draws the classes it always drew.
    return weights


def child_rng(seed: int, *key: int) -> np.random.Generator:
    """An independent stream per (seed, purpose, index...): one request's draws never shift
    another's, so changing an engine knob leaves the workload itself unchanged."""
    return np.random.default_rng(np.random.SeedSequence([seed, *key]))


def check_run(phase_starts: list[float], duration_s: float, seed: int) -> None:
    """Checks shared by every phased workload's constructor."""
    if not phase_starts:
        raise ValueError("phases is empty: give at least one phase")
    if phase_starts[0] != 0:
        raise ValueError(f"the first phase starts at {phase_starts[0]}; it must start at 0")
    if any(b <= a for a, b in itertools.pairwise(phase_starts)):
        raise ValueError(f"phase start times {phase_starts} must be strictly increasing")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s={duration_s}: must be a positive number of seconds")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be a whole number >= 0")
