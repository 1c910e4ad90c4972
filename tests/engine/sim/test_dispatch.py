"""How the twin spreads arrivals over its replicas: random (the Service's kube-proxy),
round robin (IPVS, the demo's load generator) or least requests (a load-aware router)."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.sim.cluster import SimCluster
from slopilot.engine.sim.dispatch import (
    DEFAULT_DISPATCH,
    Dispatch,
    Dispatcher,
    add_dispatch_argument,
)
from slopilot.engine.sim.scenario import ScenarioError, load_scenario, parse_scenario
from slopilot.engine.sim.simulator import simulate

ROOT = Path(__file__).resolve().parents[3]


def test_least_requests_picks_the_replica_with_the_fewest_unfinished() -> None:
    d = Dispatcher(Dispatch.LEAST_REQUESTS, seed=0)
    assert d.pick([5, 2, 7, 3]) == 1
    assert d.pick([4, 4, 1, 1]) == 2  # a tie goes to the first
    assert d.pick([0]) == 0


def test_round_robin_cycles_over_the_replicas_offered_whatever_their_load() -> None:
    d = Dispatcher(Dispatch.ROUND_ROBIN, seed=0)
    assert [d.pick([9, 0, 0]) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # Two offered now (one drained): the cycle goes on over those two.
    assert [d.pick([0, 0]) for _ in range(4)] == [1, 0, 1, 0]


def test_random_is_seeded_spreads_and_ignores_load() -> None:
    picks = [Dispatcher(Dispatch.RANDOM, seed=s) for s in (7, 7, 8)]
    runs = [[d.pick([0, 50, 50, 50]) for _ in range(4000)] for d in picks]
    assert runs[0] == runs[1]  # the same seed, the same picks
    assert runs[0] != runs[2]
    counts = Counter(runs[0])
    # Uniform over the four, the loaded ones too: each near 1,000 (sd ~27).
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(880 <= c <= 1120 for c in counts.values()), counts


def test_no_replica_to_pick_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Dispatcher(Dispatch.RANDOM, seed=0).pick([])


def _arrivals(cluster: SimCluster) -> list[tuple[Any, ...]]:
    return [(a.arrival_time, a.priority, a.max_tokens, tuple(a.prompt_token_ids))
            for a in cluster.arrivals]


def test_the_workload_drawn_is_the_same_whatever_the_policy() -> None:
    """The dispatcher draws from a stream of its own: a seed's requests are the same
    under each policy, so policies compare on the very same load."""
    sc = load_scenario("tiny-cpu")
    seen, spread = [], []
    for policy in Dispatch:
        cluster = SimCluster(dataclasses.replace(sc, dispatch=policy), dict(sc.engine),
                             replicas=3, seed=4, duration_s=30)
        cluster.advance(30.0)
        seen.append(_arrivals(cluster))
        spread.append([len(r.recorder.ev.arrived) for r in cluster.reps])
    assert len(seen[0]) > 50 and seen[0] == seen[1] == seen[2]
    assert all(min(s) > 0 for s in spread) and len({tuple(s) for s in spread}) > 1


def test_random_dispatch_follows_the_runs_seed() -> None:
    sc = dataclasses.replace(load_scenario("tiny-cpu"), dispatch=Dispatch.RANDOM)

    def where(seed: int) -> list[list[float]]:
        cluster = SimCluster(sc, dict(sc.engine), replicas=3, seed=seed, duration_s=20)
        cluster.advance(20.0)
        return [r.recorder.ev.arrived for r in cluster.reps]

    assert where(3) == where(3)
    assert where(3) != where(5)


@pytest.mark.parametrize("policy", list(Dispatch))
def test_a_draining_replica_gets_no_new_request_under_any_policy(policy: Dispatch) -> None:
    sc = dataclasses.replace(load_scenario("tiny-cpu"), dispatch=policy)
    cluster = SimCluster(sc, dict(sc.engine), replicas=3, seed=0, duration_s=40)
    cluster.advance(10.0)
    assert all(r.recorder.ev.arrived for r in cluster.reps)  # each took some before
    draining = cluster.reps[1:]
    cluster.scale(1)
    cluster.advance(40.0)
    for rep in draining:
        assert max(rep.recorder.ev.arrived) < 10.0
    assert max(cluster.reps[0].recorder.ev.arrived) > 30.0


def test_the_default_is_random_and_the_demo_scenarios_round_robin() -> None:
    assert DEFAULT_DISPATCH is Dispatch.RANDOM
    assert load_scenario("tiny-cpu").dispatch is Dispatch.RANDOM
    for name in ("demo", "demo-torch"):
        assert load_scenario(name).dispatch is Dispatch.ROUND_ROBIN
    data = {**yaml.safe_load((ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()),
            "dispatch": "least_requests"}
    assert parse_scenario(data).dispatch is Dispatch.LEAST_REQUESTS


@pytest.mark.parametrize("value", ["least_loaded", "least-requests", "RANDOM", 3])
def test_an_unknown_dispatch_is_refused_naming_the_field_value_and_choices(value: Any) -> None:
    data = {**yaml.safe_load((ROOT / "slopilot/data/scenarios/tiny-cpu.yaml").read_text()),
            "dispatch": value}
    with pytest.raises(ScenarioError, match=r"mine\.yaml: dispatch=") as info:
        parse_scenario(data, source="mine.yaml")
    text = str(info.value)
    assert f"dispatch={value!r}: unknown dispatch policy; " in text
    assert text.endswith("use one of: random, round_robin, least_requests")
    if value == "least-requests":
        assert "did you mean 'least_requests'?" in text


def test_the_flag_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="slopilot simulate")
    add_dispatch_argument(parser, "the run")
    assert parser.parse_args(["--dispatch", "round_robin"]).dispatch is Dispatch.ROUND_ROBIN
    assert parser.parse_args([]).dispatch is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--dispatch", "least-requests"])
    err = capsys.readouterr().err
    assert "argument --dispatch: least-requests: unknown dispatch policy; did you mean " \
           "'least_requests'? use one of: random, round_robin, least_requests" in err


def _bursty_four_replicas() -> Any:
    """prefill-bursts on four A100s with four times its burst rate (5 s of 50 req/s of
    ~1,000-token prompts every 30 s): a burst the fleet serves when spread evenly, and
    queues on whichever replicas chance piles it onto."""
    data = yaml.safe_load((ROOT / "slopilot/data/scenarios/prefill-bursts.yaml").read_text())
    data.update(num_gpus=4, duration_s=30)
    data["workload"]["arrivals"].update(rate=50)
    return parse_scenario(data, source="bursty x4")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_dispatch_queues_bursts_that_least_requests_spreads(seed: int) -> None:
    """What the reviewer found: least-loaded dispatch is optimistic. On the same requests
    random dispatch's P99 TTFT is far worse (1.4-1.9x on these seeds when written)."""
    sc = _bursty_four_replicas()
    p99 = {}
    for policy in (Dispatch.RANDOM, Dispatch.LEAST_REQUESTS):
        figure = simulate(dataclasses.replace(sc, dispatch=policy), seed=seed
                          ).summary.overall.ttft_p99_ms
        assert figure is not None
        p99[policy] = figure
    assert p99[Dispatch.RANDOM] > 1.3 * p99[Dispatch.LEAST_REQUESTS], p99
