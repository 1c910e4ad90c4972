"""Closed-loop traffic: a fixed number of concurrent chat sessions (or clients).

Each session holds one slot. Its first turn is a system prompt (shared with other
sessions: a pool of a few), sometimes a pasted document, and a question; every later turn
is the whole previous conversation (prompt + generated answer, exactly the finished
request's ``all_token_ids``) plus a few new user tokens, sent after a think time. So the
history is a real prefix and the prefix cache can hit. When a session has had its turns
(or would outgrow ``max_context_tokens``) a fresh session takes the slot after a think
time, which keeps concurrency at the target. Single-turn sessions with no system prompt
are the classic fixed-concurrency benchmark client.

    slot 0: [sys|question]..think..[sys|question|answer|user]..think..[...] -> new session
    slot 1:    [sys'|document|question]..think..[...]

Randomness is per session (seed, session id): a session's turns are the same whatever the
engine does, only their timing follows the engine's latency.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from slopilot.engine.request import Priority
from slopilot.engine.sim.distributions import Distribution, Fixed
from slopilot.engine.sim.workload import (
    DEFAULT_VOCAB_SIZE,
    ClassMix,
    RequestSpec,
    TokenSampler,
    check_run,
    child_rng,
)

_SESSION, _SYSTEM, _START = 11, 12, 13


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPhase:
    """How sessions behave from ``start_s`` on (sessions started then, turns sent then)."""

    start_s: float = 0.0
    concurrency: int
    turns: Distribution = Fixed(value=1)
    question_tokens: Distribution
    output_tokens: Distribution
    think_time_s: Distribution = Fixed(value=0.0)
    user_tokens: Distribution = Fixed(value=64)
    system_prompt_tokens: Distribution = Fixed(value=0)
    num_system_prompts: int = 1
    long_context_fraction: float = 0.0
    long_context_tokens: Distribution = Fixed(value=0)
    classes: ClassMix = ClassMix()
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"start_s={self.start_s}: must be a finite time >= 0")
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency}: must be at least 1 session")
        if self.num_system_prompts < 1:
            raise ValueError(f"num_system_prompts={self.num_system_prompts}: must be >= 1")
        if not 0 <= self.long_context_fraction <= 1:
            raise ValueError(
                f"long_context_fraction={self.long_context_fraction}: must be in [0, 1]")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens={self.max_context_tokens}: must be >= 2")


@dataclass(slots=True)
class _Session:
    slot: int
    priority: Priority
    num_turns: int
    rng: np.random.Generator = field(repr=False)
    turn: int = 0


class SessionWorkload:
    """Fixed-concurrency closed loop of multi-turn sessions; see the module docstring."""

    def __init__(self, phases: list[SessionPhase] | tuple[SessionPhase, ...], *,
                 duration_s: float, seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 ramp_s: float | None = None) -> None:
        check_run([p.start_s for p in phases], duration_s, seed)
        if ramp_s is not None and not (math.isfinite(ramp_s) and ramp_s >= 0):
            raise ValueError(f"ramp_s={ramp_s}: must be a finite number of seconds >= 0")
        self.phases = tuple(phases)
        self.duration_s = duration_s
        self.seed = seed
        self.ramp_s = ramp_s
        self.tokens = TokenSampler(vocab_size)
        self._system_prompts = [self._system_pool(k) for k in range(len(self.phases))]
        self._sessions: dict[int, _Session] = {}
        self._next_id = 0

    @property
    def active_sessions(self) -> int:
        """Sessions started and not yet ended (a test and a dashboard both want this)."""
        return len(self._sessions)

    def phase_at(self, t: float) -> int:
        k = 0
        while k + 1 < len(self.phases) and self.phases[k + 1].start_s <= t:
            k += 1
        return k

    def initial(self) -> Iterator[RequestSpec]:
        self._sessions.clear()
        self._next_id = 0
        firsts: list[RequestSpec] = []
        prev = 0
        for k, phase in enumerate(self.phases):
            # A phase that raises concurrency opens its extra slots at its start.
            for slot in range(prev, phase.concurrency):
                delay_rng = child_rng(self.seed, _START, k, slot)
                if self.ramp_s is not None:
                    delay = float(delay_rng.uniform(0.0, self.ramp_s)) if self.ramp_s else 0.0
                else:
                    # As if each user had just finished thinking: starts are staggered.
                    delay = phase.think_time_s.float1(delay_rng)
                spec = self._start_session(slot, phase.start_s + delay)
                if spec is not None:
                    firsts.append(spec)
            prev = max(prev, phase.concurrency)
        firsts.sort(key=lambda s: s.arrival_time)
        return iter(firsts)

    def on_finish(self, spec: RequestSpec, all_token_ids: list[int],
                  now: float) -> list[RequestSpec]:
        if spec.session_id is None:
            return []
        session = self._session_of(spec, "on_finish")
        if len(all_token_ids) < spec.num_prompt_tokens:
            raise ValueError(
                f"all_token_ids has {len(all_token_ids)} tokens, fewer than the prompt's "
                f"{spec.num_prompt_tokens}; pass prompt + output token ids")
        phase = self.phases[self.phase_at(now)]
        rng = session.rng
        at = now + phase.think_time_s.float1(rng)
        session.turn += 1
        if at >= self.duration_s:
            del self._sessions[spec.session_id]
            return []
        if session.turn < session.num_turns:
            n_user = phase.user_tokens.int1(rng)
            n_out = phase.output_tokens.int1(rng)
            limit = phase.max_context_tokens
            if limit is None or len(all_token_ids) + n_user + n_out <= limit:
                prompt = list(all_token_ids) + self.tokens.sample(rng, n_user)
                return [RequestSpec(arrival_time=at, prompt_token_ids=prompt,
                                    max_tokens=n_out, priority=session.priority,
                                    session_id=spec.session_id, turn=session.turn)]
        # The conversation is over: a new user takes the slot if the phase still wants it.
        del self._sessions[spec.session_id]
        return self._next_user(session, at)

    def on_rejected(self, spec: RequestSpec, now: float) -> list[RequestSpec]:
        """A refused turn ends its conversation: its user cannot go on (a history too
        long for the deployment stays too long). A new user takes the slot after a think
        time, as when a conversation ends by itself; without one the slot stayed empty
        for the rest of the run, and the concurrency fell with every refusal."""
        if spec.session_id is None:
            return []
        session = self._session_of(spec, "on_rejected")
        del self._sessions[spec.session_id]
        at = now + self.phases[self.phase_at(now)].think_time_s.float1(session.rng)
        return [] if at >= self.duration_s else self._next_user(session, at)

    def _session_of(self, spec: RequestSpec, report: str) -> _Session:
        session = None if spec.session_id is None else self._sessions.get(spec.session_id)
        if session is None or session.turn != spec.turn:
            raise ValueError(
                f"{report} for session {spec.session_id} turn {spec.turn}, which this "
                "workload is not waiting on; report each request's end (finished or "
                "rejected) exactly once")
        return session

    def _next_user(self, session: _Session, at: float) -> list[RequestSpec]:
        if session.slot >= self.phases[self.phase_at(at)].concurrency:
            return []
        nxt = self._start_session(session.slot, at)
        return [] if nxt is None else [nxt]

    def _start_session(self, slot: int, at: float) -> RequestSpec | None:
        if at >= self.duration_s:
            return None
        k = self.phase_at(at)
        phase = self.phases[k]
        session_id = self._next_id
        self._next_id += 1
        rng = child_rng(self.seed, _SESSION, session_id)
        priority = phase.classes.sample(rng)
        num_turns = phase.turns.int1(rng)
        pool = self._system_prompts[k]
        system = pool[int(rng.integers(len(pool)))]
        document: list[int] = []
        if phase.long_context_fraction > 0 and rng.random() < phase.long_context_fraction:
            document = self.tokens.sample(rng, phase.long_context_tokens.int1(rng))
        question = self.tokens.sample(rng, phase.question_tokens.int1(rng))
        n_out = phase.output_tokens.int1(rng)
        limit = phase.max_context_tokens
        if limit is not None:
            # A first turn too long for the context loses document tokens first, as a chat
            # front end would trim an oversized paste, and keeps room for some answer.
            room = limit - 1 - len(system) - len(question)
            document = document[:max(0, room)]
        prompt = system + document + question
        if limit is not None:
            prompt = prompt[:limit - 1]
            n_out = min(n_out, limit - len(prompt))
        self._sessions[session_id] = _Session(slot=slot, priority=priority,
                                              num_turns=num_turns, rng=rng)
        return RequestSpec(arrival_time=at, prompt_token_ids=prompt, max_tokens=n_out,
                           priority=priority, session_id=session_id, turn=0)

    def _system_pool(self, k: int) -> list[list[int]]:
        phase = self.phases[k]
        rng = child_rng(self.seed, _SYSTEM, k)
        lengths = phase.system_prompt_tokens.ints(rng, phase.num_system_prompts)
        if phase.system_prompt_tokens.nominal_mean == 0:
            return [[]]
        return [self.tokens.sample(rng, int(n)) for n in lengths]
