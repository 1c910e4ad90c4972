"""``slopilot tune`` on a trace, then the whole replay of the config it chose: what
``check_command`` runs, for the tests that hold tune's verdict against it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main
from slopilot.engine.engine import StepObserver
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.simulator import SimRun, simulate
from slopilot.engine.sim.trace_scenario import TraceOptions, load_with_trace, replay_measure


@dataclass(frozen=True)
class TunedReplay:
    out: dict[str, Any]
    """``tune --json``'s answer."""
    scenario: Scenario
    whole: SimRun
    """The best config over the whole trace, followed past its end."""


def tune_and_replay(trace: Path, capsys: pytest.CaptureFixture[str],
                    observers: tuple[StepObserver, ...] = ()) -> TunedReplay:
    """One trial on one replica (the cases are built to be judged so)."""
    assert main(["tune", "--trace", str(trace), "--trials", "1", "--max-replicas", "1",
                 "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    scenario = load_with_trace(None, TraceOptions(path=str(trace)), default="")
    whole = simulate(scenario, out["best"]["config"], measure=replay_measure(scenario),
                     observers=list(observers))
    return TunedReplay(out, scenario, whole)
