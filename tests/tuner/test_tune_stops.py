"""``slopilot tune`` stopped by Ctrl-C or SIGTERM: the open trial is told failed, the
best trial so far is said, and a stored study says how to go on with it.

Before, Ctrl-C exited 130 without a word, and SIGTERM killed the process with its
trial left RUNNING in the study until its heartbeat's grace period ran out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from slopilot.tuner.study.results import failure_reason
from tests.support.waits import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]

# The signal is sent to the process itself at the Nth call of one step (argv: signal,
# step, N): as evaluation N begins (the start config is 1, trial k is k + 2), a user's
# Ctrl-C or a supervisor's SIGTERM in the middle of a trial; or right after Optuna's
# ask has made trial N - 1 in storage, or as its tell is about to record it, where a
# stop used to leave the trial RUNNING.
_CHILD = """
import os, signal, sys
import optuna
from slopilot.tuner.sim import robust

sig, step, at = getattr(signal, sys.argv[1]), sys.argv[2], int(sys.argv[3])
owner = robust.RobustEvaluator if step == "evaluate" else optuna.Study
real, calls = getattr(owner, step), [0]

def stop_at(*args, **kwargs):
    calls[0] += 1
    if step == "ask":
        out = real(*args, **kwargs)
        if calls[0] == at:
            os.kill(os.getpid(), sig)
        return out
    if calls[0] == at:
        os.kill(os.getpid(), sig)
    return real(*args, **kwargs)

setattr(owner, step, stop_at)
from slopilot.cli import main
sys.exit(main(sys.argv[4:]))
"""

TUNE = ["tune", "--scenario", "tiny-cpu", "--trials", "3", "--duration", "4", "--seeds", "1",
        "--sampler", "random", "--quiet", "--study-name", "s"]


def _stop(sig: str, at: int, extra: list[str], step: str = "evaluate"
          ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", _CHILD, sig, step, str(at), *TUNE, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


@pytest.mark.parametrize(("sig", "code", "said"), [
    ("SIGINT", 130, "interrupted (Ctrl-C)"),
    ("SIGTERM", 143, "stopped by SIGTERM"),
])
def test_a_stopped_study_fails_its_open_trial_and_says_the_best_so_far(
        tmp_path: Path, sig: str, code: int, said: str) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    done = _stop(sig, 3, ["--storage", url])  # trial 0 done, trial 1 open
    assert done.returncode == code, done.stderr
    err = done.stderr
    assert f"slopilot tune: {said} during trial 1" in err, err
    assert "best so far: trial 0 (" in err and "goodput" in err, err
    assert "not a verdict" in err, err
    assert "resume the study with the same command: slopilot tune --scenario tiny-cpu " \
           "--trials 3 " in err and f"--storage {url} --study-name s" in err, err
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert sig.removeprefix("SIG") in (failure_reason(trials[1]) or "").upper() or \
        "KeyboardInterrupt" in (failure_reason(trials[1]) or ""), failure_reason(trials[1])


def test_a_study_stopped_before_any_trial_says_so(tmp_path: Path) -> None:
    done = _stop("SIGTERM", 1, [])  # on the start config, in memory
    assert done.returncode == 143, done.stderr
    assert "slopilot tune: stopped by SIGTERM on the start config, before any trial " \
           "completed" in done.stderr, done.stderr
    assert "best so far" not in done.stderr and "resume" not in done.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_while_a_trial_is_made_or_recorded_leaves_none_running(
        tmp_path: Path, sig: str) -> None:
    """Optuna's ask makes the trial in storage before the tuner holds it, and its tell
    is several writes: a stop in either is held until the trial is whole, then the trial
    is told failed (asked) or left complete (told)."""
    url = f"sqlite:///{tmp_path / 'ask.db'}"
    done = _stop(sig, 2, ["--storage", url], step="ask")  # trial 1 just made
    assert done.returncode in (130, 143), done.stderr
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL], done.stderr
    assert "during trial 1" in done.stderr, done.stderr

    url = f"sqlite:///{tmp_path / 'tell.db'}"
    done = _stop(sig, 2, ["--storage", url], step="tell")  # trial 1 being recorded
    assert done.returncode in (130, 143), done.stderr
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2, done.stderr
    assert "after trial 1\nbest so far: trial " in done.stderr, done.stderr
