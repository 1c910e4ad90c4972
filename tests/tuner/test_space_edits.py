"""A study outlives the space it was asked in: what an edit of the budget's bounds or
alignment does to its queued and completed trials.

The operator keeps one study per LLMDeployment and, at each new spec generation, builds
a tuner over it with the new spec's space (``spec.tuning.bounds``, ``spec.engine.
budgetAlign``); the warm starts an episode queued are still waiting in it. The budget
was stored as its rank on the bounds' grid, rebuilt from the new bounds: a queued 1024
ran as 1280 or 1536, a queued 6144 above a lowered max made ``ask`` raise IndexError (the
tick failed and rolled back), and every completed trial meant another budget to the
sampler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FixedTrial, TrialState

from slopilot.engine.config import EngineConfig
from slopilot.tuner.study.live import ResumableTuner
from slopilot.tuner.study.objective import score
from slopilot.tuner.study.space import SearchSpace
from slopilot.tuner.study.storage import open_study
from tests.support.summaries import figures, window
from tests.tuner.controller_fakes import SLO

optuna.logging.set_verbosity(optuna.logging.WARNING)
NAME = "team-a/chat/u1"


def space(lo: int = 128, hi: int = 8192, align: int = 256) -> SearchSpace:
    return SearchSpace.from_bounds({"token_budget": [lo, hi]},
                                   base=EngineConfig(budget_align=align))


def warm(s: SearchSpace, budget: int) -> dict[str, Any]:
    """A warm start: the engine's defaults with ``budget`` and a 256-token chunk."""
    base = EngineConfig().to_dict()
    return {**{k: base[k] for k in s.bounds}, "token_budget": budget, "chunk_size": 256}


def rebuilt(storage: str, s: SearchSpace, running: int) -> ResumableTuner:
    """The daemon's tuner for a new generation: the same study, the new space."""
    tuner = ResumableTuner(open_study(storage, NAME), s)
    tuner.resume(running)
    return tuner


def stored(tuner: ResumableTuner, number: int) -> optuna.trial.FrozenTrial:
    (trial,) = [t for t in tuner.study.get_trials() if t.number == number]
    return trial


@pytest.mark.parametrize(("lo", "hi"), [(768, 8192), (1024, 4096)])
def test_a_queued_warm_start_keeps_its_budget_when_the_bounds_move(
        tmp_path: Path, lo: int, hi: int) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space(512, 8192)
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, 3072), warm(before, 1024)])
    n0, c0 = tuner.ask()
    assert c0["token_budget"] == 3072
    # The tenant moves the bounds mid-trial; 1024 is still inside them.
    _, c1 = rebuilt(storage, space(lo, hi), n0).ask()
    assert c1 == before.validate(warm(before, 1024))


def test_a_queued_warm_start_above_a_lowered_max_is_skipped(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space()
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, 1024), warm(before, 6144)])
    n0, _ = tuner.ask()
    after = rebuilt(storage, space(hi=2048), n0)
    n1, c1 = after.ask()  # raised IndexError: the rank past the end of the new grid
    assert c1["token_budget"] <= 2048
    skipped = stored(after, n0 + 1)
    assert skipped.state is TrialState.FAIL and n1 == n0 + 2
    assert "skipped" in skipped.user_attrs["fail_reason"]
    assert "token_budget=6144" in skipped.user_attrs["fail_reason"]


def test_a_queued_warm_start_runs_as_itself_on_a_new_alignment_or_not_at_all(
        tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space(align=128)
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, 2048), warm(before, 640), warm(before, 1536)])
    n0, _ = tuner.ask()
    after = rebuilt(storage, space(align=256), n0)
    # 640 is not on the 256-token grid (the engine would run 768): skipped. 1536 is: it
    # runs as itself, queued again in the new alignment's terms.
    _, c = after.ask()
    assert c == {**before.validate(warm(before, 1536)), "budget_align": 256}
    reasons = [t.user_attrs["fail_reason"] for t in after.study.get_trials()
               if t.state is TrialState.FAIL]
    assert len(reasons) == 2, reasons
    assert "token_budget=640" in reasons[0] and "256-token grid" in reasons[0]


def test_every_queued_warm_start_runs_as_itself_on_a_finer_alignment(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space(align=256)
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, b) for b in (2048, 768, 4096)])
    n0, _ = tuner.ask()
    after = rebuilt(storage, space(align=128), n0)
    after.tell_failed(n0, "episode ended")
    assert [after.ask()[1]["token_budget"] for _ in range(2)] == [768, 4096]


def test_a_queued_warm_start_keeps_its_chunk_when_the_chunks_bounds_move(
        tmp_path: Path) -> None:
    # The chunk is a fraction of its range under the budget: another range, another chunk.
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space()
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, 2048), warm(before, 1024)])
    n0, _ = tuner.ask()
    after = SearchSpace.from_bounds({"chunk_size": [128, 4096]})
    _, c = rebuilt(storage, after, n0).ask()
    assert (c["token_budget"], c["chunk_size"]) == (1024, 256)


def test_any_edit_of_the_bounds_runs_no_trial_outside_them(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space()
    tuner = ResumableTuner(open_study(storage, NAME), before)
    tuner.warm_start([warm(before, b) for b in (256, 512, 1024, 2048, 4096, 8192)])
    n0, _ = tuner.ask()
    after = rebuilt(storage, space(1024, 2048), n0)
    after.tell_failed(n0, "episode ended")
    budgets = [after.ask()[1]["token_budget"] for _ in range(8)]
    assert all(1024 <= b <= 2048 for b in budgets), budgets
    assert budgets[:2] == [1024, 2048]  # the queued ones inside the new bounds, as queued


def test_completed_trials_keep_their_budgets_for_the_sampler(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    before = space(512, 8192)
    tuner = ResumableTuner(open_study(storage, NAME), before)
    for _ in range(6):
        number, config = tuner.ask()
        tuner.tell(number, score(window({"p0": figures(100.0, 20.0, 50.0)}), SLO, config))
    after = space(1024, 4096, align=256)
    for t in tuner.study.get_trials(states=(TrialState.COMPLETE,)):
        # What the sampler models a trial by is its parameters: read in the new space,
        # they are the budget the trial ran.
        ran = t.user_attrs["config"]["token_budget"]
        assert after.suggest(FixedTrial(t.params))["token_budget"] == ran


def test_a_study_stored_with_the_rank_encoding_reads_no_rank_as_a_budget(
        tmp_path: Path) -> None:
    """A study stored before the budget's parameter changed: its trials hold a rank
    (``token_budget_rank``) on the grid of bounds since edited. Its completed trials stay
    (the sampler models its other knobs by them); its queued warm starts are skipped."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    s = space()
    study = open_study(storage, NAME)
    rank = optuna.distributions.IntDistribution(1, 32, log=True)
    for r in (1, 4, 8, 16, 24, 32):
        params = {k: v for k, v in s.to_params(warm(s, 1024)).items()
                  if k != s.budget_param}
        study.add_trial(optuna.trial.create_trial(
            params={"token_budget_rank": r, **params},
            distributions={"token_budget_rank": rank, **_distributions(s, params)},
            value=float(r), user_attrs={"config": {**warm(s, 256 * r)}}))
    queued = {k: v for k, v in s.to_params(warm(s, 1024)).items() if k != s.budget_param}
    study.enqueue_trial({"token_budget_rank": 4, **queued})
    tuner = ResumableTuner(open_study(storage, NAME), space(hi=2048))
    budgets = []
    for _ in range(3):
        number, config = tuner.ask()
        budgets.append(config["token_budget"])
        tuner.tell_failed(number, "not measured")
    assert "earlier slopilot" in stored(tuner, 6).user_attrs["fail_reason"]
    assert all(256 <= b <= 2048 for b in budgets), budgets


def _distributions(s: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    trial = optuna.create_study().ask()
    s.suggest(trial)
    return {k: v for k, v in trial.distributions.items() if k in params}
