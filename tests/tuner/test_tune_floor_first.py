"""tune's replica search checks the idle floor first (``tune/capacity.py``): where a
class's prompts each alone on an idle replica already read past its TTFT limit, no count
can hold, and the search replays nothing.

Found by a reviewer: 200 P0 prompts of 6,000 tokens (each 172 ms alone against P0's
100 ms limit) cost 9 whole replays (3 candidates on 2, 4 and 8 replicas) before the
answer "P0 TTFT p99 cannot fall below 172 ms"; on a BurstGPT-like trace those replays
took 207 s of a 304 s tune.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune.capacity import capacity_answer


def _long_p0(path: Path) -> Scenario:
    """200 P0 prompts of 6,000 tokens, one a second: 172 ms each alone on an idle A100."""
    path.write_text("arrival_time,prompt_tokens,output_tokens,class\n" + "".join(
        f"{i:.1f},6000,{50 + i % 7},p0\n" for i in range(200)))
    return load_with_trace(None, TraceOptions(path=str(path)), default="")


class CountingEvaluator:
    """Counts the replays the search asks for; each reads P0 TTFT p99 at 172 % of its
    limit (what the twin reads for these prompts on any count)."""

    def __init__(self, scenario: Scenario, slo: SLOSpec, n: int = 1,
                 calls: list[tuple[str, int]] | None = None) -> None:
        self.scenario, self.slo, self.n = scenario, slo, n
        self.calls = [] if calls is None else calls
        self.margin = HEADROOM

    def at_replicas(self, n: int) -> CountingEvaluator:
        return CountingEvaluator(self.scenario, self.slo, n, self.calls)

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        self.calls.append((str(config), self.n))
        limit = self.slo.p0.ttft_p99_ms
        assert limit is not None
        return TrialResult(dict(config), 1.0, (172.0 / limit - 1.0,), False,
                           constraint_names=("p0.ttft_p99",), margin=HEADROOM)


CANDIDATES = [("trial 1", {"max_num_seqs": 64}), ("the start config", {}),
              ("trial 0", {"token_budget": 2048, "chunk_size": 1024})]


def test_a_floor_past_the_limit_replays_no_count(tmp_path: Path) -> None:
    scenario = _long_p0(tmp_path / "p0long.csv")
    ev = CountingEvaluator(scenario, scenario.slo)
    out = capacity_answer(ev, CANDIDATES, 2, 8)  # type: ignore[arg-type]
    assert ev.calls == [], "the idle floor rules every count out: nothing to replay"
    assert out.replicas is None and out.tried == {} and out.searched == ()
    sentence = out.sentence()
    assert sentence.startswith("No replica count holds the SLO"), sentence
    (floor,) = out.floors  # the lowest over the candidates' knobs: 169-172 ms
    assert floor.cls == "p0" and 160.0 < floor.ttft_ms < 180.0
    assert f"P0 TTFT p99 cannot fall below {floor.ttft_ms:.0f} ms ({floor.share:.0%} of its " \
        "100 ms limit)" in sentence
    assert "More replicas only take the queue away" in sentence
    assert "--max-replicas" not in sentence and "tried:" not in sentence
    # The candidate named is the study's closest (the first), with its knobs.
    assert out.label == "trial 1" and out.config == {"max_num_seqs": 64}
    assert out.margin == HEADROOM
    d = out.to_dict()
    assert d["searched"] == [] and d["tried"] == {} and d["flat"] is None
    assert [f["binds"] for f in d["idle_floor"]] == [True]
    # The table says why it has no rows rather than showing an empty one.
    assert "No count from 2 to 8 was replayed: the idle floor above rules every count out." \
        in out.table_lines()


def test_a_floor_under_the_limit_but_past_the_headroom_still_searches(tmp_path: Path) -> None:
    """At 96 % of its limit the floor leaves no count the headroom, but one may be within
    the SLO itself, which the answer names: so the counts are still replayed."""
    scenario = _long_p0(tmp_path / "p0long.csv")
    slo = dataclasses.replace(scenario.slo,
                              p0=dataclasses.replace(scenario.slo.p0, ttft_p99_ms=180.0))
    ev = CountingEvaluator(scenario, slo)
    out = capacity_answer(ev, CANDIDATES[:1], 2, 8)  # type: ignore[arg-type]
    assert [n for _, n in ev.calls] == [2, 4, 8]
    assert out.replicas is None
    sentence = out.sentence()
    assert sentence.startswith("No replica count holds the SLO with 10% headroom; 2 replicas "
                               "are within the SLO"), sentence
    assert "a verdict holds it only under 162 ms" in sentence


def test_the_search_shows_each_replay_on_the_progress_line(tmp_path: Path) -> None:
    """Each replay extends the bar and says which it is, not a bar frozen at 100 %."""
    scenario = _long_p0(tmp_path / "p0long.csv")
    slo = dataclasses.replace(scenario.slo,
                              p0=dataclasses.replace(scenario.slo.p0, ttft_p99_ms=180.0))
    shown: list[tuple[str, float]] = []

    class Bar:
        def replay(self, status: str, planned_s: float) -> Any:
            shown.append((status, planned_s))
            return lambda _: None

    ev = CountingEvaluator(scenario, slo)
    ev.plan = type("Plan", (), {"simulated_s": 300.0})()  # type: ignore[attr-defined]
    capacity_answer(ev, CANDIDATES[:2], 2, 8, progress=Bar())  # type: ignore[arg-type]
    assert [s for s, _ in shown] == [
        "replica search: trial 1 on 2 replicas, replay 1 of ~6",
        "replica search: trial 1 on 4 replicas, replay 2 of ~6",
        "replica search: trial 1 on 8 replicas, replay 3 of ~6",
        "replica search: the start config on 2 replicas, replay 4 of ~6",
        "replica search: the start config on 4 replicas, replay 5 of ~6",
        "replica search: the start config on 8 replicas, replay 6 of ~6"]
    assert {s for _, s in shown} == {300.0}


def test_tune_replays_no_count_where_the_floor_rules_all_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reviewer's repro through the command: the answer, its floor and the JSON's
    shape as before, with no capacity replay."""
    import json

    from slopilot.cli import main

    trace = tmp_path / "p0long.csv"
    _long_p0(trace)
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--max-replicas", "8",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    cap = out["capacity"]
    assert cap["searched"] == [] and cap["tried"] == {}
    assert out["recommended_replicas"] is None and out["config"] is None
    assert "No replica count holds the SLO" in out["verdict"]
    assert "P0 TTFT p99 cannot fall below 172 ms" in out["verdict"]
    assert cap["idle_floor"][0]["binds"] is True


def test_the_tune_progress_line_names_the_replay_and_counts_it(tmp_path: Path) -> None:
    """Through ``TuneProgress`` (no clock read: a fake one): mid-replay the line shows the
    replay's seconds within the grown total and which replay it is."""
    import io

    from slopilot.tuner.tune.progress import TuneProgress

    scenario = _long_p0(tmp_path / "p0long.csv")
    slo = dataclasses.replace(scenario.slo,
                              p0=dataclasses.replace(scenario.slo.p0, ttft_p99_ms=180.0))
    bar = TuneProgress(2, 300.0, trials=1, generated=False, stream=io.StringIO(), tty=False,
                       clock=lambda: 0.0)
    bar.simulated(600.0)  # the study done: the bar at 100 %
    lines: list[str] = []

    class HalfWay(CountingEvaluator):
        progress: Any = None

        def at_replicas(self, n: int) -> HalfWay:
            return HalfWay(self.scenario, self.slo, n, self.calls)

        def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
            self.progress(150.0)
            assert bar.report is not None
            lines.append(bar.report.line())
            self.progress(300.0)  # done: the whole replay counted, as the evaluator does
            return super().evaluate(config)

    ev = HalfWay(scenario, slo)
    ev.plan = type("Plan", (), {"simulated_s": 300.0})()  # type: ignore[attr-defined]
    capacity_answer(ev, CANDIDATES[:1], 2, 8, progress=bar)  # type: ignore[arg-type]
    assert lines[0].startswith("tune: 750/900 s simulated (83%)"), lines[0]
    assert lines[0].endswith("replica search: trial 1 on 2 replicas, replay 1 of ~3")
    assert lines[2].startswith("tune: 1,350/1,500 s simulated (90%)"), lines[2]
    assert lines[2].endswith("replica search: trial 1 on 8 replicas, replay 3 of ~3")
    bar.close()
