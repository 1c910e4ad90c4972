"""The demo's story without processes: what each tick's alerts, decision and window add."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from slopilot.tuner.local.demo_story import DemoResult, Narrator, Story
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import AlertAction
from tests.tuner.controller_fakes import GOOD, Rig, alert, summary


def test_the_story_records_alert_trial_commit_and_restore() -> None:
    out = io.StringIO()
    result = DemoResult(report=Path("report.md"))
    story = Story(Narrator(Console(file=out, width=200), result.lines), result, 8.0)
    ctl = Rig().build()
    tbt = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
    story.alerts_now(tbt, 30.0)
    story.alerts_now(tbt, 31.0)  # still firing: said once
    story.decided(Decision(ControllerState.TUNING, Action.TRIAL, "trial 0 on canary", 2,
                           trial=0, config=GOOD), ctl, 32.0)
    story.decided(Decision(ControllerState.COOLDOWN, Action.COMMIT, "commit: trial 0", 2,
                           config=GOOD, summary=summary()), ctl, 45.0)
    story.window(summary(), ctl, tbt, 46.0)  # the alert still fires: not restored yet
    story.alerts_now([], 50.0)
    story.window(summary(p0_ttft=5000.0), ctl, [], 51.0)  # a window that misses
    story.window(summary(), ctl, [], 52.0)
    assert (result.alert_at_s, result.trials, result.commit_at_s, result.restored_at_s,
            result.scaled) == (30.0, 1, 45.0, 52.0, False)
    said = [line.split("] ", 1)[1] for line in result.lines]
    assert said[0].startswith("ALERT firing: SlopilotTBTP99High[p0")
    assert said[1].startswith("TRIAL   state=tuning replicas=2: trial 0 on canary | config")
    assert "COMMIT" in said[2] and "P0 TTFT/TBT P99 100/20 ms" in said[2]
    assert said[3:] == ["alerts resolved", "SLO restored: every class within its SLO over "
                        "the last 8 s, no alert firing"]
    assert out.getvalue().count("\n") == len(result.lines)


def test_a_twin_check_is_told_and_reported() -> None:
    from slopilot.tuner.local.demo_report import twin_section
    from tests.tuner.test_twin_check import WINDOW_S, plant

    p = plant()
    d = p.ctl.tick(WINDOW_S)
    out = io.StringIO()
    result = DemoResult(report=Path("report.md"))
    Story(Narrator(Console(file=out, width=300), result.lines), result, 8.0).decided(
        d, p.ctl, WINDOW_S)
    assert result.twin == d.twin
    said = [line.split("] ", 1)[1] for line in result.lines]
    assert said[0].startswith("TWIN    trusted (step-time error")
    assert "after refit | P0 TTFT P99" in said[0] and "ms measured" in said[0]
    # A trusted twin 40-90 % off on one window's P99s read as a contradiction: say why.
    assert said[0].endswith("ms (one window's, not judged)")
    section = twin_section(result.twin)
    assert "| p0 |" in section and "trusted" in section and "after refit" in section
    assert "The step times judge it." in section
    assert "Not checked" in twin_section(None)
