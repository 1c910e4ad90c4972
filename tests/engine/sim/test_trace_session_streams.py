"""A JSONL trace's sessions: each one's token stream is held only while a turn of it is
still to be drawn (a replay held every session's, as Python ints, to its end: 20,000
rows in 4,000 sessions took 892 MB against 111 MB without session ids), and the tokens
each turn gets are those a stream grown as a list of ints gave, draw for draw."""

from __future__ import annotations

import gc
import json
import random
from pathlib import Path

import numpy as np
import pytest

from slopilot.engine.sim import trace
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.trace import TraceRecord, TraceWorkload
from slopilot.engine.sim.trace_scenario import TraceOptions, replay_measure, with_trace
from slopilot.engine.sim.workload import SyntheticPrompt, TokenSampler, child_rng


def _sessions(n_sessions: int, turns: int, seed: int = 3) -> list[TraceRecord]:
    """Interleaved sessions, each turn longer than the last (one stream a session)."""
    r = random.Random(seed)
    rows = []
    for s in range(n_sessions):
        t, length = r.uniform(0, 100), r.randint(20, 60)
        for _ in range(turns):
            rows.append((t, length, s))
            t += r.uniform(1, 30)
            length += r.randint(5, 40)
    rows.sort()
    return [TraceRecord(t, n, 4, session_id=s, index=i) for i, (t, n, s) in enumerate(rows)]


def _live_streams() -> int:
    # type(), not isinstance(): isinstance reads __class__, and torch's lazy module
    # attributes among the heap's objects warn when read.
    return sum(type(o) is trace._SessionStream for o in gc.get_objects())


def test_a_sessions_stream_is_let_go_once_its_last_turn_is_drawn() -> None:
    records = _sessions(40, 4)
    last = {r.session_id: i for i, r in enumerate(records)}
    first = {r.session_id: i for i, r in reversed(list(enumerate(records)))}
    source = TraceWorkload(records, seed=5).initial()
    before = _live_streams()
    for i in range(len(records)):
        spec = next(source)  # the replay stays open: its generator is suspended here
        spec.prompt_token_ids[0]  # drawn, as the simulator draws it on admission
        del spec
        # Open: a turn drawn, the last not yet. Every other session's stream is gone.
        open_now = sum(first[s] <= i < last[s] for s in last)
        assert _live_streams() - before <= open_now, f"after row {i}"
    assert _live_streams() == before
    assert next(source, None) is None


def test_a_turn_not_yet_drawn_keeps_its_stream_and_reads_it_whole() -> None:
    """The last turn of a session arrives before an earlier turn is drawn (both queued):
    the earlier one still gets its prefix of the stream."""
    records = [TraceRecord(0.0, 30, 4, session_id=0, index=0),
               TraceRecord(1.0, 50, 4, session_id=0, index=1)]
    early, late = TraceWorkload(records, seed=2).initial()
    tail = list(late.prompt_token_ids)
    assert list(early.prompt_token_ids) == tail[:30]


def _list_grown(records: list[TraceRecord], seed: int,
                order: list[int]) -> dict[int, list[int]]:
    """Each prompt as the replay drew it before streams were kept compactly: a session's
    list of ints grown by ``TokenSampler.sample`` from its own generator, by as many ids
    as a prompt read past its end, prompts drawn in ``order``."""
    sampler = TokenSampler()
    streams: dict[int, tuple[np.random.Generator, list[int]]] = {}
    out = {}
    for i in order:
        r = records[i]
        assert r.session_id is not None
        rng, ids = streams.setdefault(
            r.session_id, (child_rng(seed, trace._SESSION_TOKENS, r.session_id), []))
        if len(ids) < r.prompt_tokens:
            ids.extend(sampler.sample(rng, r.prompt_tokens - len(ids)))
        out[i] = ids[:r.prompt_tokens]
    return out


def test_each_turn_gets_the_tokens_a_list_grown_stream_gave() -> None:
    """Draws of one generator in pieces are not those of one draw, so a stream must grow
    by the same pieces in the same order: the prefix cache's hits, and every figure of
    a replay, stay as they were."""
    records = _sessions(25, 5, seed=8)
    for order in (list(range(len(records))), random.Random(1).sample(range(len(records)),
                                                                      len(records))):
        specs = list(TraceWorkload(records, seed=11).initial())
        got = {i: list(specs[i].prompt_token_ids) for i in order}
        assert got == _list_grown(records, 11, order)


def test_a_stream_holds_two_bytes_a_token_for_a_32k_vocabulary() -> None:
    records = [TraceRecord(0.0, 4000, 4, session_id=0, index=0),
               TraceRecord(1.0, 6000, 4, session_id=0, index=1)]
    source = TraceWorkload(records, seed=0).initial()
    prompt = next(source).prompt_token_ids
    assert isinstance(prompt, SyntheticPrompt)
    stream = prompt._draw.__self__  # type: ignore[union-attr]  # the bound prefix()
    assert isinstance(stream, trace._SessionStream)
    prompt[0]
    assert isinstance(stream.ids, np.ndarray) and stream.ids.nbytes == 4000 * 2


class _ListGrownStream:
    """The stream as it was: a list of ints, grown by ``TokenSampler.sample``."""

    def __init__(self, sampler: TokenSampler, rng: np.random.Generator) -> None:
        self.sampler = sampler
        self.rng = rng
        self.ids: list[int] = []

    def prefix(self, n: int) -> list[int]:
        if len(self.ids) < n:
            self.ids.extend(self.sampler.sample(self.rng, n - len(self.ids)))
        return self.ids[:n]


def test_a_sessions_replay_gives_the_figures_the_list_grown_streams_gave(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole simulated replay, its prompts admitted in the simulator's order: every
    figure (the prefix cache's hits among them) as it was with list-grown streams."""
    rows = [{"arrival_time": r.arrival_time, "prompt_tokens": r.prompt_tokens * 20,
             "output_tokens": 30, "session_id": r.session_id} for r in _sessions(30, 4)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scenario = with_trace(load_scenario("azure-conv-2023"), TraceOptions(path=str(path)))

    def replay() -> dict[str, object]:
        return simulate(scenario, measure=replay_measure(scenario)).summary.to_dict()

    now = replay()
    monkeypatch.setattr(trace, "_SessionStream", _ListGrownStream)
    assert now == replay()
    assert isinstance(now["prefix_hit_rate"], float) and now["prefix_hit_rate"] > 0.5
