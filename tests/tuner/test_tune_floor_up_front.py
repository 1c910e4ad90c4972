"""The idle floor said before the study (``tune/run.py``), and priced on a generated
workload's seeds too (``tune/idle_floor.py``).

Found by a reviewer: with P0's prompts each alone on an idle replica past P0's TTFT
limit, no trial can hold on any count, yet the study ran in full (60 s of a 61 s tune of
a bursty trace) before the answer said so; and a generated workload (``tiny-cpu``) got
no floor at all, its answer left to the flatness test at the search's largest count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import Scenario, load_scenario
from slopilot.tuner.sim.robust import plan_windows
from slopilot.tuner.tune import idle_floor
from slopilot.tuner.tune.capacity import capacity_answer
from slopilot.tuner.tune.idle_floor import idle_floors

LONG_P0 = """\
name: long-p0
description: P0 prompts whose prefill alone outlasts P0's TTFT limit
gpu: H100   # as the trace's default deployment
num_gpus: 1
tp: 1
model: llama-3-8b
duration_s: 10
seed: 0
workload:
  type: open_loop
  arrivals: {process: poisson, rate: 1}
  prompt_tokens: {dist: fixed, value: 6000}
  output_tokens: {dist: fixed, value: 16}
  classes: {p0: 1.0}
slo:
  profile: standard
  classes:
    p0: {ttft_p99_ms: 100, tbt_p99_ms: 200}
"""

# Prompts drawn per seed (lognormal): each seed's P99 prompt differs.
DRAWN = LONG_P0.replace("{dist: fixed, value: 6000}",
                        "{dist: lognormal, mean: 3000, sigma: 0.6, min: 16, max: 7000}")


def _scenario(tmp_path: Path, text: str = LONG_P0) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario(path)


def test_a_generated_workloads_floor_is_its_prompts_each_alone(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    plan = plan_windows(scenario, seeds=2)
    (floor,) = idle_floors(scenario, {}, plan=plan)
    # The trace's figure for the same 6,000-token prompts (test_tune_floor_first.py).
    assert floor.cls == "p0" and 160.0 < floor.ttft_ms < 180.0 and floor.past_limit
    assert floor.prompt_tokens == 6000 and floor.requests > 0
    assert floor.window.startswith("seed "), floor.window
    assert f"in {floor.window}" in floor.text()


def test_the_floor_over_seeds_is_the_worst_seeds(tmp_path: Path) -> None:
    """Every seed is judged (``robust_verdict``), so the seed whose floor is highest is
    the one no count can bring under it."""
    scenario = _scenario(tmp_path, DRAWN)
    plan = plan_windows(scenario, seeds=3)
    (floor,) = idle_floors(scenario, {}, plan=plan)
    each = []
    for w in plan.windows:
        one = plan_windows(scenario, seeds=1)
        one = type(one)((w,), one.kind)
        (f,) = idle_floors(scenario, {}, plan=one)
        each.append(f.ttft_ms)
    assert len(set(each)) > 1, each  # the seeds' prompts differ
    assert floor.ttft_ms == max(each)


class Counting:
    """An evaluator whose replays are counted (none should be)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario, self.slo = scenario, scenario.slo
        self.plan = plan_windows(scenario, seeds=2)
        self.margin = 0.1
        self.calls: list[int] = []

    def at_replicas(self, n: int) -> Counting:
        self.calls.append(n)
        return self


def test_a_generated_workloads_floor_past_the_limit_replays_no_count(tmp_path: Path) -> None:
    ev = Counting(_scenario(tmp_path))
    out = capacity_answer(ev, [("the start config", {})], 2, 8)  # type: ignore[arg-type]
    assert ev.calls == [] and out.skipped and out.replicas is None
    assert "P0 TTFT p99 cannot fall below" in out.sentence()


def test_tune_says_the_floor_before_the_study_and_prices_each_config_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.cli import main

    path = tmp_path / "s.yaml"
    path.write_text(LONG_P0)
    priced: list[tuple[str, int]] = []
    alone = idle_floor._alone_ms

    def counted(scenario: Scenario, config: Mapping[str, Any], priority: Priority,
                tokens: int) -> float:
        priced.append((json.dumps(dict(config), sort_keys=True), tokens))
        return alone(scenario, config, priority, tokens)

    monkeypatch.setattr(idle_floor, "_alone_ms", counted)
    assert main(["tune", "--scenario", str(path), "--trials", "1", "--seeds", "2",
                 "--max-replicas", "4", "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    warning = next(line for line in captured.err.splitlines()
                   if "cannot fall below" in line)
    assert warning.startswith("slopilot tune: warning: on the start config's knobs, P0 TTFT "
                              "p99 cannot fall below 1"), warning
    assert "100 ms limit" in warning
    for cure in ("loosen P0's TTFT limit", "faster GPU", "shorten P0's prompts"):
        assert cure in warning, (cure, warning)
    out = json.loads(captured.out)
    assert any("cannot fall below" in w for w in out["warnings"])
    # The study still ran (the closest config is still worth finding).
    assert out["trials"] == 1
    # The capacity answer reused the start config's floor: no config priced twice.
    assert len(priced) == len(set(priced)), priced
    assert out["capacity"]["searched"] == []
