"""What an edit of ``spec.engine`` does to the loop's memory (``loop_status.rebase_episode``).

A committed config belongs to the spec it was committed under: ``status.tunedConfig``
carries that spec's hash, and an edit makes it stale (``knobs.tuned_overlay``). The
loop's own memory of the commit (``best_config``, kept in ``status.controller`` after the
episode) is stale with it: once an edit left the tuned config behind, a rollback
restored the old commit over the edit and recorded it as the edited spec's tuned config.
An open episode's own best is its trials' and stays; its baseline becomes the spec.
"""

from __future__ import annotations

from typing import Any

from slopilot.operator.knobs import engine_checksum
from slopilot.operator.loop_status import rebase_episode
from slopilot.operator.spec import parse_spec
from slopilot.tuner.loop.state import ControllerState, LoopState, PendingRestore, RolloutWatch
from tests.operator.operator_support import llmd

COMMITTED = {"token_budget": 512, "chunk_size": 256}


def committed_under(engine: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The CR with spec.engine ``now``, whose tuned config was committed under ``engine``."""
    body = llmd(engine=engine)
    base = engine_checksum(body)
    tuned = parse_spec(body).engine.with_overrides(COMMITTED).to_dict()
    return {**llmd(engine=now), "status": {"tunedConfig": {"engine": tuned, "base": base}}}


def loop_in(state: ControllerState, baseline: dict[str, Any]) -> LoopState:
    return LoopState(state=state, baseline_config=dict(baseline),
                     best_config=dict(COMMITTED), best_goodput=150.0)


def test_an_edit_after_the_commit_forgets_it_and_the_spec_is_the_baseline() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    for state in (ControllerState.STEADY, ControllerState.COOLDOWN, ControllerState.SCALING):
        loop = loop_in(state, before)
        rebase_episode(loop, body)
        assert (loop.best_config, loop.best_goodput) == (None, None), state
        assert loop.baseline_config == parse_spec(body).engine.to_dict()
        assert loop.baseline_config["token_budget"] == 2048


def test_an_edit_during_an_episode_keeps_its_best_and_rebases_its_baseline() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    for state in (ControllerState.TUNING, ControllerState.COMMIT):
        loop = loop_in(state, before)
        rebase_episode(loop, body)
        assert loop.best_config == COMMITTED and loop.best_goodput == 150.0, state
        assert loop.baseline_config["token_budget"] == 2048


def test_without_an_edit_the_commit_and_the_baseline_stay() -> None:
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 1024})
    loop = loop_in(ControllerState.STEADY, before)
    rebase_episode(loop, body)
    assert loop == loop_in(ControllerState.STEADY, before)


def test_a_loop_that_never_tuned_is_left_as_it_is() -> None:
    loop = LoopState()
    rebase_episode(loop, llmd(engine={"tokenBudget": 2048}))
    assert loop == LoopState()


def test_an_edit_while_a_restore_is_owed_makes_the_spec_what_it_restores() -> None:
    # The episode's rollback failed and is retried: retried after the edit with the old
    # config, it undid the edit on every pod and recorded it as the edited spec's.
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    loop = loop_in(ControllerState.COOLDOWN, before)
    loop.pending_restore = PendingRestore(since=1.0, attempts=1, retry_at=1.0,
                                          error="RuntimeError: down")
    assert loop.rollback_config() == COMMITTED  # the episode's best, before the edit
    rebase_episode(loop, body)
    assert loop.rollback_config() == parse_spec(body).engine.to_dict()


def test_an_edit_during_a_commits_rollout_drops_its_revert() -> None:
    """The edit renders a new template over the commit's: reverted later to the config
    committed before it, the old knobs undid the edit as a rollback's did."""
    before = parse_spec(llmd(engine={"tokenBudget": 1024})).engine.to_dict()
    body = committed_under({"tokenBudget": 1024}, {"tokenBudget": 2048})
    loop = loop_in(ControllerState.COOLDOWN, before)
    loop.rollout = RolloutWatch(since=10.0, config=dict(COMMITTED), revert_to=dict(before))
    rebase_episode(loop, body)
    assert loop.rollout is not None and loop.rollout.revert_to is None
    unedited = committed_under({"tokenBudget": 1024}, {"tokenBudget": 1024})
    kept = loop_in(ControllerState.COOLDOWN, before)
    kept.rollout = RolloutWatch(since=10.0, config=dict(COMMITTED), revert_to=dict(before))
    rebase_episode(kept, unedited)
    assert kept.rollout is not None and kept.rollout.revert_to == before
