"""``slopilot tune --storage``: a study is resumed only under what its trials were run
under (the scenario's contents, replicas, windows, fixed knobs, bounds, profile,
objective); a resume under anything else is refused, naming what differs.

Before, a study was found by name alone: trials run on 4 replicas were ranked as if run
on 1, and the verdict recommended one of them "on 1 replica" that missed there by 2.5-8x.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest

from slopilot.cli import main
from slopilot.engine.sim.scenario import scenario_file

FIRST = ["--trials", "2", "--duration", "4", "--seeds", "1", "--replicas", "2",
         "--max-replicas", "2", "--sampler", "random", "--quiet", "--study-name", "s"]


def _scenario(folder: Path, *, rate: str = "rate: 3}", slo: str = "ttft_p99_ms: 300") -> Path:
    text = Path(str(scenario_file("tiny-cpu"))).read_text()
    path = folder / "mytiny.yaml"
    path.write_text(text.replace("name: tiny-cpu", "name: mytiny")
                    .replace("rate: 3}", rate).replace("ttft_p99_ms: 300", slo))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study of two trials on 2 replicas: the database to copy for each resume."""
    folder = tmp_path_factory.mktemp("made")
    scenario = _scenario(folder)
    url = f"sqlite:///{folder / 'study.db'}"
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--storage", url]) == 0
    return folder / "study.db"


def _copy(made: Path, tmp_path: Path) -> str:
    shutil.copy(made, tmp_path / "study.db")
    return f"sqlite:///{tmp_path / 'study.db'}"


def _trials(url: str) -> int:
    return len(optuna.load_study(study_name="s", storage=url).trials)


def _flags(flags: list[str], **changed: str) -> list[str]:
    out = list(flags)
    for flag, value in changed.items():
        out[out.index("--" + flag.replace("_", "-")) + 1] = value
    return out


@pytest.mark.parametrize(("change", "named"), [
    (_flags(FIRST, replicas="1", max_replicas="1"), "replicas: 2 then, 1 now"),
    (_flags(FIRST, duration="3"), "windows: seed 0: 0-4 s (+0 s warm-up, +1.3333333333333333 s "
                                  "drain) then, seed 0: 0-3 s (+0 s warm-up, +1 s drain) now"),
    (_flags(FIRST, seeds="2"), "seed 1: 0-4 s"),
    ([*FIRST, "--set", "max_num_seqs=64"], "fixed knobs (--set): max_num_seqs unset then, 64 now"),
    ([*FIRST, "--dispatch", "least_requests"], "dispatch: random then, least_requests now"),
    ([*FIRST, "--bound", "max_num_seqs=16:128"],
     "search space (--bound, --set): max_num_seqs 8..1024 log then, 16..128 log now"),
])
def test_a_resume_under_other_flags_is_refused_naming_what_differs(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        change: list[str], named: str) -> None:
    url = _copy(made, tmp_path)
    scenario = _scenario(tmp_path)
    capsys.readouterr()
    assert main(["tune", "--scenario", str(scenario), *change, "--storage", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "study 's'" in err and "was run under other settings" in err, err
    assert named in err, err
    # The fix: the command the study was made with, or another study.
    assert "--replicas 2 --max-replicas 2" in err and "--study-name" in err, err
    assert _trials(url) == 2  # nothing was added to it


@pytest.mark.parametrize(("edit", "named"), [
    ({"slo": "ttft_p99_ms: 900"}, "SLO: p0.ttft_p99_ms 300 then, 900 now"),
    ({"rate": "rate: 12}"}, "workload: sha256:"),
])
def test_a_resume_with_the_scenario_edited_is_refused(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        edit: dict[str, str], named: str) -> None:
    """The scenario's file may be edited between runs (the reviewer's repro): its
    contents are recorded, not its name or path."""
    url = _copy(made, tmp_path)
    scenario = _scenario(tmp_path, **edit)
    capsys.readouterr()
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--storage", url]) == 2
    err = capsys.readouterr().err
    assert named in err and "was run under other settings" in err, err
    assert "replicas:" not in err  # only what differs
    assert _trials(url) == 2


def test_the_same_settings_resume_whatever_the_scenario_file_is_called(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _copy(made, tmp_path)
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    scenario = _scenario(elsewhere)
    assert main(["tune", "--scenario", str(scenario),
                 *_flags(FIRST, trials="1"), "--storage", url]) == 0
    assert _trials(url) == 3


def test_a_study_without_the_record_is_refused_unless_it_has_no_trials(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study an older slopilot made has trials run under flags nobody recorded: it is
    refused, not trusted; an empty one (no completed trial) is adopted."""
    url = _copy(made, tmp_path)
    with sqlite3.connect(tmp_path / "study.db") as db:
        db.execute("DELETE FROM study_user_attributes")
    scenario = _scenario(tmp_path)
    capsys.readouterr()
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "has 2 completed trials" in err and "records no settings" in err, err
    assert "--study-name" in err and "optuna delete-study" in err, err
    assert _trials(url) == 2

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(study_name="s", storage=empty, direction="maximize")
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--storage", empty]) == 0
    assert _trials(empty) == 2
    assert main(["tune", "--scenario", str(scenario),
                 *_flags(FIRST, replicas="1", max_replicas="1"), "--storage", empty]) == 2
    assert "replicas: 2 then, 1 now" in capsys.readouterr().err


def test_every_shipped_scenario_records_the_same_settings_in_every_process() -> None:
    """The record is compared across processes: a value that printed an object's address
    (``<... at 0x7f...>``) or hashed a dict's order would refuse every resume."""
    import json

    from slopilot.cli import build_parser
    from slopilot.engine.sim.scenario import list_scenarios
    from slopilot.tuner.sim.robust import plan_windows
    from slopilot.tuner.tune.settings import settings_from
    from slopilot.tuner.tune.study_record import trial_settings

    def record(name: str) -> str:
        s = settings_from(build_parser().parse_args(["tune", "--scenario", name]))
        plan = plan_windows(s.scenario, duration_s=s.duration_s, seeds=s.seeds,
                            warmup_s=s.warmup_s, whole=s.whole, config=dict(s.start.config),
                            replicas=s.replicas)
        return json.dumps(trial_settings(s, plan), sort_keys=True)

    for name in list_scenarios():
        first = record(name)
        assert " at 0x" not in first, (name, first)
        assert record(name) == first, name


def test_a_resume_on_another_cost_profile_is_refused(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.profiles import profile_file

    url = _copy(made, tmp_path)
    scenario = _scenario(tmp_path)
    profile = profile_file(tmp_path)
    capsys.readouterr()
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--profile", str(profile),
                 "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "cost profile: datasheet then, calibrated " in err, err
    assert _trials(url) == 2


def test_a_record_from_before_the_dispatch_policy_resumes_under_least_requests(
        made: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study recorded before the twin had a dispatch policy ran its trials with every
    arrival sent to the least-loaded replica: that is what its record means, so it
    resumes under ``--dispatch least_requests`` and is refused under the new default,
    with the flag named as the fix."""
    url = _copy(made, tmp_path)
    study = optuna.load_study(study_name="s", storage=url)
    record = dict(study.user_attrs["slopilot_tune_record"])
    record["settings"] = {k: v for k, v in record["settings"].items() if k != "dispatch"}
    study.set_user_attr("slopilot_tune_record", record)
    scenario = _scenario(tmp_path)
    capsys.readouterr()
    assert main(["tune", "--scenario", str(scenario), *FIRST, "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "dispatch: least_requests then, random now" in err, err
    assert "--dispatch least_requests" in err, err
    assert _trials(url) == 2
    assert main(["tune", "--scenario", str(scenario), *_flags(FIRST, trials="1"),
                 "--dispatch", "least_requests", "--storage", url]) == 0
    assert _trials(url) == 3
