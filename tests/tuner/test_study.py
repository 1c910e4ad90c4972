"""Study storage and the ask/tell Tuner: resume after a crash, warm start, best(), errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from slopilot.tuner.sim.evaluator import SimulatorEvaluator
from slopilot.tuner.study.evaluator import WindowRejected
from slopilot.tuner.study.heartbeat import TrialHeartbeat
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.objective import TrialResult
from slopilot.tuner.study.results import failure_reason
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import StudyStorageError, open_study
from slopilot.tuner.study.tuner import Tuner
from tests.support.summaries import OLD_CLUSTER, OLD_PROMETHEUS
from tests.support.waits import HANG_GUARD_S, wait_for

T = TypeVar("T")

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPO = Path(__file__).resolve().parents[2]


def _result(config: Mapping[str, Any], goodput: float, *constraints: float) -> TrialResult:
    return TrialResult(config=dict(config), goodput_tok_s=goodput, constraints=constraints,
                       feasible=all(c <= 0 for c in constraints),
                       constraint_names=tuple(f"t{i}" for i in range(len(constraints))))


def test_best_prefers_feasible_goodput_then_least_violation() -> None:
    tuner = Tuner(open_study(None, "best"), SearchSpace.from_bounds())
    assert tuner.best() is None
    n0, c0 = tuner.ask()
    tuner.tell(n0, _result(c0, 500.0, 0.5, -0.1))  # infeasible, violation 0.5
    n1, c1 = tuner.ask()
    tuner.tell(n1, _result(c1, 900.0, 2.0, 0.1))  # infeasible, violation 2.1
    best = tuner.best()
    assert best is not None and best.goodput_tok_s == 500.0  # the least infeasible
    n2, c2 = tuner.ask()
    tuner.tell(n2, _result(c2, 100.0, -0.5, -0.2))
    n3, c3 = tuner.ask()
    tuner.tell(n3, _result(c3, 300.0, -0.1, 0.0))
    n4, _ = tuner.ask()
    tuner.tell_failed(n4, "engine crashed")
    best_trial = tuner.best_trial()
    assert best_trial is not None and best_trial[0] == n3
    assert best_trial[1].config == c3 and best_trial[1].feasible
    trials = tuner.study.get_trials()
    assert trials[n4].state == TrialState.FAIL
    assert trials[n4].user_attrs["fail_reason"] == "engine crashed"
    assert trials[n3].constraints == {"t0": -0.1, "t1": 0.0}  # what Optuna's TPE reads
    with pytest.raises(KeyError, match="trial 3 is not open"):
        tuner.tell(n3, _result(c3, 1.0))


def test_run_on_the_simulator_stores_results_in_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    evaluator = SimulatorEvaluator("tiny-cpu", duration_s=10)
    space = SearchSpace.from_bounds({"max_num_seqs": [16, 256]})
    seen: list[int] = []
    best = Tuner(open_study(url, "sim"), space).run(
        evaluator, 4, callback=lambda n, r: seen.append(n))
    assert seen == [0, 1, 2, 3]
    assert best is not None and best.goodput_tok_s > 0
    assert len(best.constraints) == len(best.constraint_names) == 5
    # Another process (here: a fresh Tuner) reads the same results back from the file.
    again = Tuner(open_study(url, "sim"), space)
    assert [n for n, _ in again.results()] == [0, 1, 2, 3]
    assert again.best() == best


def test_warm_start_queues_configs_that_come_back_unchanged() -> None:
    space = SearchSpace.from_bounds()
    source = Tuner(open_study(None, "offline", seed=5), space)
    configs = [source.ask()[1] for _ in range(3)]
    live = Tuner(open_study(None, "live"), space)
    assert live.warm_start(configs) == 3
    assert [live.ask()[1] for _ in range(3)] == configs
    with pytest.raises(ConfigError, match="outside the space"):
        Tuner(open_study(None, "narrow"), SearchSpace.from_bounds(
            {"max_num_seqs": [8, 16]})).warm_start([{**configs[0], "max_num_seqs": 900}])


class _Flaky:
    """Rejects the first ``n`` windows, then scores every config the same."""

    def __init__(self, rejections: int) -> None:
        self.left = rejections
        self.calls = 0
        self.slo = SLOSpec.from_profile("standard")

    def evaluate(self, config: Mapping[str, Any]) -> TrialResult:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise WindowRejected("too few samples")
        return _result(config, 10.0, -1.0)


def test_rejected_windows_are_repeated_not_counted() -> None:
    tuner = Tuner(open_study(None, "flaky"), SearchSpace.from_bounds())
    flaky = _Flaky(rejections=2)
    tuner.run(flaky, 2)
    assert flaky.calls == 4
    assert [t.state for t in tuner.study.get_trials()] == [TrialState.COMPLETE] * 2
    stubborn = _Flaky(rejections=100)
    tuner.run(stubborn, 1, max_rejections=2)
    last = tuner.study.get_trials()[-1]
    assert last.state == TrialState.FAIL
    assert "rejected 3 times: too few samples" in last.user_attrs["fail_reason"]


# Heartbeats every second, stale after 15 missed ones. The test waits for the dead
# process's failure, not a fixed time; and every check of this process's trial (each
# opening of the study fails the stale ones) waits first for its heartbeat thread's next
# beat (``_after_a_beat``), so however long a busy machine leaves that thread unscheduled,
# no check runs on a heartbeat it has not yet renewed.
BEAT = {"heartbeat_s": 1, "grace_s": 15}

_CHILD = textwrap.dedent("""
    import sys, time
    from slopilot.tuner.study.space import SearchSpace
    from slopilot.tuner.study.storage import open_study
    from slopilot.tuner.study.tuner import Tuner
    tuner = Tuner(open_study(sys.argv[1], "crash", heartbeat_s=1, grace_s=15),
                  SearchSpace.from_bounds())
    number, config = tuner.ask()
    print("asked", number, flush=True)
    while True:  # an evaluation that never ends: the test kills us here
        time.sleep(1)
""")


def _state(url: str, number: int) -> TrialState:
    # Opening the study fails the stale trials first, as every ask does.
    return open_study(url, "crash", sampler="random", **BEAT).get_trials()[number].state


class _Beats:
    """Tells when ``heartbeat`` has recorded its next beat (its thread's own call)."""

    def __init__(self, heartbeat: TrialHeartbeat, monkeypatch: pytest.MonkeyPatch) -> None:
        self.recorded = threading.Event()
        beat = heartbeat._beat

        def counted(number: int, trial_id: int) -> None:
            beat(number, trial_id)
            self.recorded.set()

        monkeypatch.setattr(heartbeat, "_beat", counted)

    def after_a_beat(self, check: Callable[[], T]) -> T:
        self.recorded.clear()
        wait_for(self.recorded.is_set, what="this process's next trial heartbeat")
        return check()


def test_a_killed_process_s_trial_is_failed_a_live_one_s_is_not_and_numbering_continues(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    tuner = Tuner(open_study(url, "crash", **BEAT), SearchSpace.from_bounds())
    for _ in range(2):
        n, c = tuner.ask()
        tuner.tell(n, _result(c, 1.0))
    live, _ = tuner.ask()  # trial 2: this (live) process keeps it
    assert tuner.heartbeat is not None
    beats = _Beats(tuner.heartbeat, monkeypatch)
    log = tmp_path / "child.log"
    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, url], stdout=out,
                                 stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for(lambda: "asked" in log.read_text() or child.poll() is not None,
                 what="the child to ask a trial")
        assert "asked 3" in log.read_text(), log.read_text()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=HANG_GUARD_S)
    # The dead child's trial stops beating and is failed after the grace period; this
    # process's trial, asked before it, beat all along and is still running.
    wait_for(lambda: beats.after_a_beat(lambda: _state(url, 3)) == TrialState.FAIL,
             what="the killed process's trial to be failed as stale")
    trials = beats.after_a_beat(lambda: open_study(url, "crash", **BEAT).get_trials())
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.RUNNING,
                                                                       TrialState.FAIL]
    assert "stopped sending heartbeats" in (failure_reason(trials[3]) or "")
    tuner.tell(live, _result({}, 2.0))
    resumed = Tuner(open_study(url, "crash", **BEAT), SearchSpace.from_bounds())
    number, _ = resumed.ask()
    assert number == 4  # the failed trial stays in the history and keeps its number
    resumed.tell_failed(number, "engine crashed")
    assert failure_reason(resumed.study.get_trials()[4]) == "engine crashed"


def test_fail_running_fails_what_this_tuner_holds_and_stops_beating(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gone.db'}"
    tuner = Tuner(open_study(url, "gone", **BEAT), SearchSpace.from_bounds())
    done, _ = tuner.ask()
    tuner.tell(done, _result({}, 1.0))
    a, _ = tuner.ask()
    b, _ = tuner.ask()
    assert tuner.heartbeat is not None and tuner.heartbeat.beating == {a, b}
    assert tuner.fail_running("the LLMDeployment was deleted") == [a, b]
    trials = tuner.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL]
    assert {failure_reason(t) for t in trials[1:]} == {"the LLMDeployment was deleted"}
    assert tuner.fail_running("again") == []
    assert tuner.heartbeat.beating == set()
    wait_for(lambda: not tuner.heartbeat.running,  # type: ignore[union-attr]
             what="the heartbeat thread to end")
    assert Tuner(open_study(None, "memory"), SearchSpace.from_bounds()).heartbeat is None


def test_delete_study_removes_its_own_study_only_and_stops_beating(tmp_path: Path) -> None:
    """A deleted LLMDeployment's study goes; another namespace's ``chat`` in the same
    storage stays, trials and all."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    gone = ResumableTuner(open_study(url, "team-a/chat/u1", **BEAT), SearchSpace.from_bounds())
    kept = Tuner(open_study(url, "team-b/chat/u2", **BEAT), SearchSpace.from_bounds())
    gone.ask()
    number, _ = kept.ask()
    gone.delete_study()
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["team-b/chat/u2"]
    assert gone.heartbeat is not None and not gone.heartbeat.beating
    gone.delete_study()  # already deleted (by another replica, say): nothing to do
    assert [t.state for t in open_study(url, "team-b/chat/u2", **BEAT).get_trials()] == [
        TrialState.RUNNING]
    kept.tell_failed(number, "done")
    kept.close()


def test_delete_study_names_what_to_do_for_a_study_not_opened_here() -> None:
    tuner = Tuner(optuna.create_study(study_name="elsewhere"), SearchSpace.from_bounds())
    with pytest.raises(StudyStorageError, match="'elsewhere' was not opened by open_study"):
        tuner.delete_study()


def test_a_trial_the_previous_version_left_running_goes_stale_too(tmp_path: Path) -> None:
    """The previous version marked trials with host:pid:token and sent no heartbeats."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = optuna.create_study(storage=url, study_name="old", direction="maximize")
    old.ask().set_user_attr("slopilot_worker", "gone-host:4242:0123456789ab")
    old.ask()  # RUNNING, unmarked: not ours to judge
    wait_for(lambda: open_study(url, "old", **BEAT).get_trials()[0].state
             == TrialState.FAIL, what="the old trial to be failed as stale")
    assert open_study(url, "old", **BEAT).get_trials()[1].state == TrialState.RUNNING


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"heartbeat_s": 0}, r"heartbeat_s=0: expected whole seconds >= 1"),
    ({"heartbeat_s": 1.5}, r"heartbeat_s=1.5: expected whole seconds"),
    ({"heartbeat_s": 10, "grace_s": 10}, r"grace_s=10: expected more than heartbeat_s=10"),
])
def test_bad_heartbeat_settings_name_the_field(tmp_path: Path, kwargs: dict[str, Any],
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_study(f"sqlite:///{tmp_path / 'x.db'}", "x", **kwargs)


def test_a_study_stored_by_the_previous_version_still_loads(tmp_path: Path) -> None:
    """Trials told by the previous ``Tuner.tell`` (summaries as plain dicts, NaN for an
    empty P99) read back as typed summaries; one whose summary is unreadable is kept."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    space = SearchSpace.from_bounds()
    old = optuna.create_study(storage=url, study_name="old", direction="maximize")
    for goodput, summary in ((95.0, OLD_PROMETHEUS), (107.9, OLD_CLUSTER),
                             (50.0, {"classes": "lost"})):
        config = EngineConfig().to_dict()
        old.add_trial(optuna.trial.create_trial(
            params=space.to_params(config),
            distributions=_distributions(space), value=goodput,
            user_attrs={"config": config, "goodput_tok_s": goodput, "constraints": [-0.5],
                        "constraint_names": ["p0.ttft_p99"], "feasible": True,
                        "summary": summary}))
    results = Tuner(open_study(url, "old"), space).results()
    assert [r.goodput_tok_s for _, r in results] == [95.0, 107.9, 50.0]
    prom, cluster, lost = (r.summary for _, r in results)
    assert prom is not None and prom.classes[Priority.P2].ttft_p99_ms is None
    assert prom.window is not None and prom.window.end == 100.0
    assert cluster is not None and cluster.replicas == 1
    assert lost is None


def _distributions(space: SearchSpace) -> dict[str, Any]:
    trial = optuna.create_study().ask()
    space.suggest(trial)
    return dict(trial.distributions)


@pytest.mark.parametrize(("storage", "message"), [
    ("study.db", r"not a database URL; use sqlite:///"),
    ("nosuchdb://x/y", r"cannot open study storage 'nosuchdb://x/y'"),
    ("sqlite:////nonexistent-dir/sub/study.db", r"cannot open study storage"),
])
def test_bad_storage_urls_say_what_to_use(storage: str, message: str) -> None:
    with pytest.raises(StudyStorageError, match=message):
        open_study(storage, "x")


def test_bad_sampler_and_name() -> None:
    with pytest.raises(ValueError, match="sampler='cmaes': use one of: tpe, random"):
        open_study(None, "x", sampler="cmaes")
    with pytest.raises(ValueError, match="study name is empty"):
        open_study(None, " ")
    with pytest.raises(ValueError, match="n_trials=-1"):
        Tuner(open_study(None, "x"), SearchSpace.from_bounds()).run(_Flaky(0), -1)


def test_postgresql_storage_is_shared_between_tuners() -> None:
    from tests.tuner.postgres import find_postgres, postgres_server

    bindir = find_postgres()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    pytest.importorskip("psycopg2")
    with postgres_server(bindir) as url:
        space = SearchSpace.from_bounds()
        a = Tuner(open_study(url, "shared"), space)
        b = Tuner(open_study(url, "shared", seed=1), space)
        na, ca = a.ask()
        nb, cb = b.ask()
        assert (na, nb) == (0, 1)  # one numbering across workers
        b.tell(nb, _result(cb, 5.0, -1.0))
        a.tell(na, _result(ca, 7.0, -1.0))
        # A RUNNING trial of a live worker (this process) is left alone on reopen.
        nc, _ = a.ask()
        reopened = open_study(url, "shared")
        assert reopened.get_trials()[nc].state == TrialState.RUNNING
        best = Tuner(reopened, space).best()
        assert best is not None and best.goodput_tok_s == 7.0
        a.close()  # stop beating before the server goes away
