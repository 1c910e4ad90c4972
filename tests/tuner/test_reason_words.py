"""The ``reason`` label of the actions counter is a closed vocabulary (``reasons.py``).

The operator's one page carries every tenant's series and is sized per CR: a reason that
starts with a user-written name, an alert's or a figure must not make a label value of its
own, and every kind of reason the controller writes must still be told apart (its own
word, not ``other``). ``reason_scan`` follows each counted reason in the loop's source
back to the word written first."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from slopilot.tuner.loop.controller import STEPS
from slopilot.tuner.loop.decision import Action
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.reasons import LABEL_PAIRS, WRITTEN_WITH, Reason, reason_token
from tests.tuner.reason_scan import STEP_STATES, Source, Unresolved

WRITTEN_FIRST = ["chat_prod: its model", "Qwen_instruct holds", "team_a's deployment",
                 "SlopilotTTFTHigh fired", "kv_watermark at its bound", "Traceback",
                 "ConnectionError: refused", "the load changed", "backoff", "steady",
                 "no scale_up above", "more replicas", "active since the commit"]
"""Texts put first by interpolation: names users write, alerts', knobs', exceptions'."""


def _labels(metrics: TunerMetrics) -> set[tuple[str, str]]:
    text = generate_latest(metrics.registry).decode()
    return {(line.split('action="')[1].split('"')[0], line.split('reason="')[1].split('"')[0])
            for line in text.splitlines() if line.startswith("slopilot_tuner_actions_total")}


def test_a_reason_written_first_from_anything_but_the_controller_is_other() -> None:
    metrics = TunerMetrics().in_namespace("team-a")
    for action in Action:
        for text in WRITTEN_FIRST:
            metrics.action("chat", action, text)
    assert _labels(metrics) == {(a.value, "other") for a in Action if a is not Action.NONE}


def test_a_word_of_the_table_written_with_another_action_is_other() -> None:
    # The pairs are what the page is sized from: a word only with its own actions.
    assert reason_token("scale_up 1->2", Action.SCALE) == "scale_up"
    assert reason_token("scale_up 1->2", Action.REVERT) == "other"
    assert reason_token("commit: trial 3") == "commit"
    metrics = TunerMetrics()
    for action in Action:
        for reason in Reason:
            metrics.action("chat", action, f"{reason.value}: a text")
    assert {(Action(a), Reason(r)) for a, r in _labels(metrics)} == LABEL_PAIRS


def test_every_reason_the_controller_counts_has_its_own_word_in_the_table() -> None:
    written = Source().written()
    assert written, "the scan found no counted reason: it reads nothing"
    table = {r.value: actions for r, actions in WRITTEN_WITH.items()}
    found: dict[str, set[Action]] = {}
    for w in written:
        found.setdefault(w.word, set()).update(w.actions)
    missing = sorted(f"{w.word} with {sorted(w.actions - table.get(w.word, frozenset()))} "
                     f"({w.where})" for w in written
                     if not w.actions <= table.get(w.word, frozenset()))
    assert not missing, f"reasons.py: list these words with these actions: {missing}"
    unused = {r: sorted(a - found.get(r, set())) for r, a in table.items()
              if not a <= found.get(r, set())}
    assert not unused, f"reasons.py lists pairs the controller never counts: {unused}"


def test_the_scan_fails_on_a_reason_it_cannot_follow(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def told(ctx, deployment):\n"
        "    return ctx.decide(Action.INFORM, f'{deployment.name}: said')\n"
        "def raised(ctx, exc):\n"
        "    return ctx.decide(Action.REVERT, str(exc))\n"
        "def quiet(ctx, thing):\n"
        "    return ctx.decide(Action.NONE, thing.text())\n")
    source = Source(tmp_path)
    sites = list(source.counted())
    assert len(sites) == 3
    for action, reason, site in sites[:2]:
        with pytest.raises(Unresolved):
            source._pairs(action, reason, site.fn, set())
    assert source._pairs(*sites[2][:2], sites[2][2].fn, set()) == []  # never counted


def test_the_scan_reads_a_word_that_runs_into_an_interpolation_as_unknown(
        tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def f(ctx, kind):\n"
        "    return ctx.decide(Action.SCALE, f'scale_{kind} 1->2')\n")
    source = Source(tmp_path)
    (action, reason, site), = source.counted()
    with pytest.raises(Unresolved, match="runs on"):
        source._pairs(action, reason, site.fn, set())


def test_the_scan_reads_reasons_given_by_keyword_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def f(ctx):\n"
        "    return ctx.decide(action=Action.SCALE, reason='scale_up 1->2')\n"
        "def g(ctx, go):\n"
        "    return Go(ControllerState.COOLDOWN, Event.X, reason='scale_down 2->1',\n"
        "              action=Action.SCALE)\n"
        "def cooldown(ctx, tick, entered):\n"
        "    return ctx.decide(entered.action, entered.reason)\n")
    words = {(w.word, tuple(w.actions)) for w in Source(tmp_path).written()}
    assert words == {("scale_up", (Action.SCALE,)), ("scale_down", (Action.SCALE,))}
    (tmp_path / "mod.py").write_text(
        "def f(go, n):\n"
        "    return dataclasses.replace(go, reason=f'{n} replicas; {go.reason}')\n")
    with pytest.raises(Unresolved, match="does not start with the old one"):
        Source(tmp_path).written()


def test_the_scan_knows_each_step_function_by_its_state() -> None:
    assert {fn.__name__: state.name for state, fn in STEPS.items()} == STEP_STATES
