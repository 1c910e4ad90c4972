"""The report's note where the whole trace missed on every count replayed: it said the
config "missed over the whole trace on every count up to --max-replicas 8" where the
replays began at the windows' count, bisected (not every count), some held while the
count above missed, and the capacity search's other candidates were searched in the
windows only below its answer and never replayed whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from slopilot.engine.sim.scenario import load_scenario
from slopilot.tuner.study.objective import HEADROOM, TrialResult
from slopilot.tuner.tune.capacity import CapacityOutcome
from slopilot.tuner.tune.report import context
from slopilot.tuner.tune.whole_check import WholeCheck, WholeRun


def _result(ok: bool) -> TrialResult:
    return TrialResult({"name": "a"}, 1.0, (-0.5 if ok else 0.5,), ok, margin=HEADROOM)


def _outcome(cap: CapacityOutcome | None, whole: WholeCheck, tuned: int) -> Any:
    best = SimpleNamespace(label="trial 1", result=_result(cap is None), trial=1,
                           is_start=False)
    return SimpleNamespace(
        capacity=cap, config=None, sentence="...", whole=whole, warnings=(),
        plan=SimpleNamespace(describe=lambda: "judged on 3 windows", windows=[],
                             kind="trace"),
        settings=SimpleNamespace(replicas=tuned, start=SimpleNamespace(note=lambda: None)),
        recommended_replicas=None, command="slopilot tune", check_command=None,
        timing=SimpleNamespace(line=lambda: "9 evaluations"), start=_result(False),
        best=best, feasible=cap is None, changes=None, best_trial=None,
        tuner=SimpleNamespace(results=lambda: [], space=SimpleNamespace(bounds={})))


def _whole(held: dict[int, bool], lucky: tuple[int, ...] = (), gave_up: bool = False
           ) -> WholeCheck:
    runs = tuple(WholeRun(n, _result(ok), 0.0) for n, ok in held.items())
    return WholeCheck(runs, 8, load_scenario("tiny-cpu").slo, 45.0, None, lucky, gave_up)


def _note(outcome: Any) -> str:
    notes = [n for n in context(outcome).extra if n.startswith("The plots judge")]
    assert len(notes) == 1, context(outcome).extra
    return notes[0]


def test_a_capacity_answer_missed_whole_says_what_was_replayed_and_searched() -> None:
    cap = CapacityOutcome(3, {"name": "a"}, "trial 1", 2, 8, {2: _result(False),
                                                              3: _result(True)},
                          searched=(("trial 1", 2, False, False), ("trial 1", 4, True, True),
                                    ("trial 1", 3, True, True),
                                    ("the start config", 2, False, False)))
    # Replayed whole from the windows' 3: 4 and 6 held while 5 and 7 missed, the climb
    # gave up and 8 missed.
    whole = _whole({3: False, 4: True, 5: False, 6: True, 7: False, 8: False},
                   lucky=(4, 6), gave_up=True)
    note = _note(_outcome(cap, whole, tuned=1))
    assert "every count up to" not in note, note
    assert "drawn as holding" not in note, note  # the plots draw 1 replica: it missed there
    assert "trial 1, which held in the windows on 3 replicas" in note, note
    assert ("replayed over the whole trace on 3 to 8 replicas (3, 4, 5, 6, 7, 8; "
            "--max-replicas 8)") in note, note
    assert "4 held but 5 missed; 6 held but 7 missed" in note, note
    assert ("The start config was searched in the windows only, up to 2 replicas (below "
            "3, the best count so far), and not replayed over the whole trace") in note, note


def test_the_tuned_count_missed_whole_on_each_count_replayed() -> None:
    whole = _whole({1: False, 2: False, 4: False, 8: False})
    note = _note(_outcome(None, whole, tuned=1))
    assert note.startswith("The plots judge each config in the study's windows only: "
                           "trial 1, drawn as holding the SLO there on 1 replica, missed "
                           "over the whole trace on each count replayed, 1 to 8 replicas "
                           "(1, 2, 4, 8; --max-replicas 8)"), note
