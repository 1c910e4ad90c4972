"""The tune report's capacity section: its table and the verdict name the same config,
or say plainly which each is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune.capacity import CapacityOutcome
from slopilot.tuner.tune.outcome import Candidate
from slopilot.tuner.tune.report import context

TERMS = ("p0.ttft_p99", "p0.tbt_p99")


def result(name: str, p0_ttft: float, p0_tbt: float) -> TrialResult:
    """A config missing the SLO, its terms as shares of their limits."""
    return TrialResult({"name": name}, 1.0, (p0_ttft - 1.0, p0_tbt - 1.0), False,
                       constraint_names=TERMS, margin=HEADROOM)


def outcome(best: Candidate, start: TrialResult, trials: list[tuple[int, TrialResult]],
            cap: CapacityOutcome) -> Any:
    """What ``context`` reads of a ``TuneOutcome`` where nothing holds up to 16."""
    return SimpleNamespace(
        capacity=cap, config=None, sentence="No configuration tried holds the SLO ...",
        plan=SimpleNamespace(describe=lambda: "3 workload seeds", windows=[], kind="seeds"),
        settings=SimpleNamespace(replicas=1, start=SimpleNamespace(note=lambda: None)),
        recommended_replicas=None, command="slopilot tune --scenario tiny-cpu",
        check_command=None, timing=SimpleNamespace(line=lambda: "31 evaluations"),
        start=start, best=best, feasible=False, changes=None, whole=None, warnings=(),
        best_trial=None,
        tuner=SimpleNamespace(results=lambda: trials))


def test_the_table_of_another_candidate_than_the_verdicts_says_which_each_is() -> None:
    # tiny-cpu (tune --trials 30): the verdict's closest on 1 replica is trial 24 (P0 TTFT
    # p99 420 ms, 140 %); the capacity table is the start config's, closest on 16, whose
    # 1-replica row read P0 TBT p99 275 % under "the candidate closest to holding".
    start = result("start", 1.45, 2.75)
    t24 = result("t24", 1.40, 0.43)
    cap = CapacityOutcome(
        None, start.config, "the start config", 2, 16,
        tried={2: result("start", 1.44, 2.73), 4: result("start", 1.445, 1.2),
               8: result("start", 1.445, 1.18), 16: result("start", 1.263, 1.17)},
        others=(("trial 24", {2: result("t24", 1.37, 0.4), 16: result("t24", 1.314, 0.4)}),))
    lines = context(outcome(Candidate(t24, 24), start, [(24, t24)], cap)).capacity
    text = "\n".join(lines)
    assert "| 1 | no | no | P0 TBT p99 | 275% | - |" in lines
    assert "Each count's figures are the start config's, the candidate closest to holding " \
        "on 16 replicas, the most searched (its worst term the lowest there)." in lines
    assert "On 1 replica, the count tuned at, the verdict's closest config is trial 24 (P0 " \
        "TTFT p99 at 140% of its limit); the table's row for 1 is the start config's." \
        in text


def test_the_table_of_the_verdicts_own_config_adds_nothing() -> None:
    start = result("start", 1.45, 2.75)
    cap = CapacityOutcome(None, start.config, "the start config", 2, 16,
                          tried={2: result("start", 1.44, 2.73),
                                 16: result("start", 1.263, 1.17)})
    lines = context(outcome(Candidate(start), start, [], cap)).capacity
    assert not any("the count tuned at" in line for line in lines)
    assert "| 1 | no | no | P0 TBT p99 | 275% | - |" in lines
