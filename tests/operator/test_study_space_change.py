"""A deployment's study whose trials were run under another search space (a release
that added a ``preemption_mode`` value, flipped a knob's ``log``, changed its kind).

Optuna refuses a parameter another distribution kind, other choices or another ``log``
in one study: every ask failed, and the loop went alert -> error -> revert -> cooldown
-> the same error for good, its study filling with failed trials. The operator goes on in
a successor study named for the space, says so once, and deletes it with the CR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from slopilot.operator.daemon import prometheus_controller, study_name
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.prometheus.alerts import AlertAction
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from slopilot.tuner.study.tuner import Tuner
from tests.operator.test_production_wiring import context
from tests.tuner.controller_fakes import FakeAlerts, FakeDeployment, Rig, alert

BASE = study_name("team", "chat", "u1")  # test_production_wiring.context's CR


def storage_of(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def history(tmp_path: Path) -> None:
    """The study as an older release left it: one trial whose ``preemption_mode`` had two
    choices and whose ``max_preemptions_per_step`` was log-scaled."""
    older = ResumableTuner(open_study(storage_of(tmp_path), BASE), SearchSpace.from_bounds({
        "preemption_mode": ["recompute", "swap"],
        "max_preemptions_per_step": {"lo": 1, "hi": 16, "log": True}}))
    number, _ = older.ask()
    older.tell_failed(number, "episode ended")
    older.close()


def said(ctx_warnings: list[tuple[str, str]]) -> list[str]:
    return [message for _reason, message in ctx_warnings]


def build(tmp_path: Path, told: list[tuple[str, str]]) -> Any:
    ctx = context(tmp_path)
    return prometheus_controller(
        type(ctx)(**{**ctx.__dict__, "warn": lambda reason, msg: told.append((reason, msg))}))


def test_a_study_run_under_another_space_goes_on_in_a_successor(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    history(tmp_path)
    told: list[tuple[str, str]] = []
    ctl = build(tmp_path, told)
    assert isinstance(ctl.study, Tuner)
    rig = Rig(dep=FakeDeployment(n=3), offline=None,
              alerts=FakeAlerts([alert(AlertAction.RETUNE)]), study=ctl.study)
    loop = rig.build()
    actions, t = [], 0.0
    for _ in range(6):
        d = loop.tick(t)
        actions.append(d.action)
        assert "ValueError" not in d.reason, d.line()
        t += 31
    assert Action.TRIAL in actions  # the alert led to a trial
    successor = ctl.study.study.study_name
    assert successor != BASE and successor.startswith(BASE + "/space-")
    asked = ctl.study.study.get_trials(deepcopy=False)
    assert asked and all(tr.state.name != "FAIL" for tr in asked)
    # The base study is history, untouched: its one trial, as it was.
    base = optuna.load_study(study_name=BASE, storage=storage_of(tmp_path))
    assert [tr.state.name for tr in base.trials] == ["FAIL"]
    # Said once, naming each knob and what changed.
    assert [reason for reason, _ in told] == ["StudySpaceChanged"]
    message = told[0][1]
    assert "preemption_mode: choices (recompute, swap) then, (recompute, swap, auto) now" \
        in message, message
    assert "max_preemptions_per_step: log-scaled then, linear now" in message, message
    assert successor in message and BASE in message
    assert message in caplog.text


def test_a_reopened_deployment_finds_the_same_successor_and_says_nothing_again(
        tmp_path: Path) -> None:
    history(tmp_path)
    told: list[tuple[str, str]] = []
    first = build(tmp_path, told)
    number, _ = first.study.ask()
    first.study.tell_failed(number, "episode ended")
    first.study.close()
    again = build(tmp_path, told)  # a spec edit, a restarted operator
    assert again.study.study.study_name == first.study.study.study_name
    assert len(optuna.get_all_study_names(storage_of(tmp_path))) == 2  # no third study
    assert len(told) == 1
    again.study.ask()  # and it asks, in the successor
    again.study.close()


def test_a_study_of_todays_space_stays_the_one_study(tmp_path: Path) -> None:
    today = ResumableTuner(open_study(storage_of(tmp_path), BASE), SearchSpace.from_bounds({}))
    today.ask()
    today.close()
    told: list[tuple[str, str]] = []
    ctl = build(tmp_path, told)
    assert ctl.study.study.study_name == BASE and not told
    assert optuna.get_all_study_names(storage_of(tmp_path)) == [BASE]


def test_a_backend_switch_goes_on_in_a_study_of_its_own_and_says_so(tmp_path: Path) -> None:
    """vLLM's space is a subset of the built-in engine's, so no space conflict moved it:
    the vLLM loop's sampler went on from the built-in engine's trials."""
    told: list[tuple[str, str]] = []
    ctx = context(tmp_path)
    builtin = prometheus_controller(
        type(ctx)(**{**ctx.__dict__, "warn": lambda reason, msg: told.append((reason, msg))}))
    number, _ = builtin.study.ask()
    builtin.study.tell_failed(number, "episode ended")
    builtin.study.close()
    assert builtin.study.study.study_name == BASE and told == []
    ctx = context(tmp_path, backend="vllm")
    vllm = prometheus_controller(
        type(ctx)(**{**ctx.__dict__, "warn": lambda reason, msg: told.append((reason, msg))}))
    successor = vllm.study.study.study_name
    assert successor != BASE and successor.startswith(BASE + "/space-")
    assert vllm.study.study.get_trials(deepcopy=False) == []
    assert [reason for reason, _ in told] == ["StudySpaceChanged"]
    assert "backend builtin" in told[0][1] and "backend vllm" in told[0][1], told
