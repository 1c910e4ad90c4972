"""The demo's story without processes: what each tick's alerts, decision and window add."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from slopilot.tuner.local.demo_story import DemoResult, Narrator, Story
from slopilot.tuner.loop.controller import Controller
from slopilot.tuner.loop.decision import Action, Decision
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.prometheus.alerts import Alert, AlertAction
from tests.tuner.controller_fakes import GOOD, SLO, Rig, alert, summary


def rules(say: Narrator, result: DemoResult) -> Story:
    """The demo's restore rule: 8 s windows, held for 16 s, on 10 requests each."""
    return Story(say, result, SLO, rate_window_s=8.0, hold_s=16.0, min_requests=10)
TBT = [alert(AlertAction.SCALE, "SlopilotTBTP99High")]
OTHER = {"token_budget": 1024, "chunk_size": 128}


def story(width: int = 300) -> tuple[Story, DemoResult, io.StringIO]:
    out = io.StringIO()
    result = DemoResult(report=Path("report.md"))
    return rules(Narrator(Console(file=out, width=width), result.lines), result), result, out


def committed(*, alert_at: float, trials: list[tuple[float, dict[str, int]]],
              commit_at: float, quiet: bool = False) -> tuple[Story, DemoResult, Controller]:
    """A story of one episode: the TBT alert, ``trials`` (each at its time, numbered in
    turn), the last one committed at ``commit_at`` (the alert resolved then: ``quiet``);
    the story, its result and the controller it was told of."""
    s, result, _ = story()
    ctl = Rig().build()
    s.alerts_now(TBT, alert_at)
    for number, (at_s, config) in enumerate(trials):
        s.decided(trial(number, config), ctl, at_s)
    if quiet:
        s.alerts_now([], commit_at)
    s.decided(commit(len(trials) - 1, trials[-1][1]), ctl, commit_at)
    return s, result, ctl


def said(result: DemoResult) -> list[str]:
    return [line.split("] ", 1)[1] for line in result.lines]


def at(result: DemoResult, text: str) -> float:
    """The time printed on the first line that starts with ``text``."""
    line = next(line for line in result.lines if line.split("] ", 1)[1].startswith(text))
    return float(line[3:line.index("s]")])


def trial(n: int, config: dict[str, int]) -> Decision:
    return Decision(ControllerState.TUNING, Action.TRIAL, f"trial {n} on canary", 2,
                    trial=n, config=config)


def commit(n: int, config: dict[str, int]) -> Decision:
    return Decision(ControllerState.COOLDOWN, Action.COMMIT, f"commit: trial {n} holds", 2,
                    config=config, summary=summary())


def hold_windows(s: Story, ends: range, *, firing: list[Alert] | None = None) -> None:
    for end in ends:
        s.window(summary(), firing or [], end - 8.0, float(end))


def test_the_story_records_alert_trial_commit_and_restore() -> None:
    s, result, out = story()
    ctl = Rig().build()
    s.alerts_now(TBT, 30.0)
    s.alerts_now(TBT, 31.0)  # still firing: said once
    s.decided(trial(0, GOOD), ctl, 32.0)
    s.decided(commit(0, GOOD), ctl, 45.0)
    s.window(summary(), TBT, 37.0, 45.0)  # the alert still fires: not restored yet
    s.alerts_now([], 50.0)
    hold_windows(s, range(53, 70))  # 53..69: each wholly after the commit, 16 s of them
    assert (result.alert_at_s, result.trials) == (30.0, 1)
    [episode] = result.episodes
    assert (episode.alert_at_s, episode.trials, episode.action, episode.action_at_s,
            episode.committed_trial) == (30.0, [0], "commit", 45.0, 0)
    assert [(v.kind, v.at_s) for v in episode.verdicts] == [("restored", 69.0)]
    lines = said(result)
    assert lines[0].startswith("ALERT firing: SlopilotTBTP99High[p0")
    assert lines[1].startswith("TRIAL   state=tuning replicas=2: trial 0 on canary | config")
    assert "COMMIT" in lines[2] and "P0 TTFT/TBT P99 100/20 ms" in lines[2]
    # What the verdict rests on: the window's finished requests, per class.
    assert "30 requests finished in the window (P0 10, P1 10, P2 10)" in lines[2]
    assert lines[3] == "alerts resolved"
    assert lines[4] == (
        "SLO restored (episode 1): every class within its SLO and no alert firing in each "
        "of the 17 windows of 8 s ending t+53.0s to t+69.0s (16.0 s), all after the commit at "
        "t+45.0s; each window on at least 30 finished requests, P0 at least 10")
    assert at(result, "SLO restored") == 69.0
    assert out.getvalue().count("\n") == len(result.lines)


def test_restored_is_judged_only_on_windows_after_the_commit_and_withdrawn_on_a_miss(
        ) -> None:
    """The reviewer's r2: COMMIT at t+149.0 and "SLO restored" at t+149.1 on the window
    [141.1, 149.1], which held nothing run under the committed config; the SLO broke at
    t+151 (P0 TBT P99 95 ms against 60) and the claim stood to the end."""
    s, result, _ = committed(alert_at=133.9, trials=[(133.9, OTHER), (137.9, GOOD)],
                             commit_at=149.0, quiet=True)
    s.window(summary(), [], 141.1, 149.1)  # ends after the commit, starts before it
    hold_windows(s, range(157, 172))  # 14 s of windows after it: not yet the 16 s asked
    [episode] = result.episodes
    assert episode.verdicts == [] and not any("restored" in line for line in said(result))
    s.window(summary(p0_tbt=95.0), [], 164.0, 172.0)  # missed before any restore: silent
    hold_windows(s, range(173, 189))  # 173..188: 15 s since the miss broke the run
    assert episode.verdicts == []
    hold_windows(s, range(189, 190))
    assert [(v.kind, v.at_s) for v in episode.verdicts] == [("restored", 189.0)]
    s.window(summary(p0_tbt=95.0), [], 182.0, 190.0)
    assert [(v.kind, v.at_s) for v in episode.verdicts] == [("restored", 189.0),
                                                            ("missed", 190.0)]
    assert said(result)[-1] == (
        "SLO missed again (episode 1): P0 TBT p99 95 ms > 60 ms in the 8 s window ending "
        "t+190.0s (30 finished requests, P0 10); the restore at t+189.0s is withdrawn")
    assert at(result, "SLO missed again") == 190.0
    s.finish(200.0)
    assert episode.describe() == (
        "episode 1: alert SlopilotTBTP99High[p0,warning] at t+133.9s; trials 0, 1; "
        "commit of trial 1 at t+149.0s (its window: 30 finished requests, P0 10); SLO "
        "restored at t+189.0s, missed again at t+190.0s, not restored again by the end "
        "of the run at t+200.0s")


def test_a_window_on_too_few_requests_or_without_the_alerts_class_is_no_verdict() -> None:
    from tests.support.summaries import figures, window

    s, result, _ = committed(alert_at=10.0, trials=[(11.0, GOOD)], commit_at=20.0)
    few = window({"p0": figures(100.0, 20.0, 50.0, finished=3),
                  "p1": figures(200.0, 40.0, 50.0, finished=3)})
    no_p0 = window({"p1": figures(200.0, 40.0, 50.0, finished=30)})
    for end in range(28, 60):
        s.window(few if end % 2 else no_p0, [], end - 8.0, float(end))
    assert result.episodes[0].verdicts == []
    # A miss on 6 requests is no verdict either: a restore is not taken back on it.
    hold_windows(s, range(60, 77))
    s.window(window({"p0": figures(100.0, 500.0, 50.0, finished=6)}), [], 69.0, 77.0)
    assert [v.kind for v in result.episodes[0].verdicts] == ["restored"]


def test_each_episode_keeps_its_own_alert_trials_commit_and_verdicts() -> None:
    """The summary said "alert at t+131s, 3 trial(s), commit/scale at t+233s, SLO
    restored at t+233s": the first episode's alert with the second's commit, and the
    tick's start (t+131) for an alert printed at t+133.9."""
    s, result, ctl = committed(alert_at=133.9, trials=[(133.9, OTHER), (137.9, GOOD)],
                               commit_at=149.0, quiet=True)
    hold_windows(s, range(157, 174))
    sustained = [alert(AlertAction.RETUNE, "SlopilotTTFTP99Sustained")]
    s.alerts_now(sustained, 222.9)
    s.decided(trial(2, OTHER), ctl, 222.9)
    s.decided(commit(2, OTHER), ctl, 233.0)
    hold_windows(s, range(241, 243), firing=sustained)
    s.finish(243.0)
    first, second = result.episodes
    assert (first.alert_at_s, first.trials, first.action_at_s, first.committed_trial) == (
        133.9, [0, 1], 149.0, 1)
    assert (second.alert_at_s, second.trials, second.action_at_s,
            second.committed_trial) == (222.9, [2], 233.0, 2)
    assert first.alert_at_s == at(result, "ALERT firing: SlopilotTBTP99High")
    assert second.alert_at_s == at(result, "ALERT firing: SlopilotTTFTP99Sustained")
    assert [v.kind for v in first.verdicts] == ["restored"]
    assert first.describe().endswith(
        "SLO restored at t+173.0s, held until episode 2 opened at t+222.9s")
    assert second.describe().endswith(
        "SLO not restored by the end of the run at t+243.0s (a restore needs 24 s of "
        "windows after the commit; the run gave it 10 s)")
    assert result.committed() == (second, OTHER)


def test_the_summary_lists_every_episode_with_the_printed_times() -> None:
    from slopilot.tuner.local.demo_story import summary_lines

    s, result, _ = committed(alert_at=133.9, trials=[(133.9, GOOD)], commit_at=149.0)
    s.finish(160.0)
    lines = summary_lines(result)
    assert lines[0] == "summary: 1 episode, 1 trial started; report report.md"
    assert lines[1] == "  " + result.episodes[0].describe()
    assert "t+133.9s" in lines[1] and "t+149.0s" in lines[1]
    assert lines[2] == ("  ended committed: trial 0's config {'token_budget': 512, "
                        "'chunk_size': 256}, committed at t+149.0s in episode 1")
    assert summary_lines(DemoResult(report=Path("r.md")))[0] == (
        "summary: no episode (no trial, commit or scale), 0 trials started; report r.md")


def test_a_twin_check_is_told_and_reported() -> None:
    from slopilot.tuner.local.demo_report import twin_section
    from tests.tuner.test_twin_check import WINDOW_S, plant

    p = plant()
    d = p.ctl.tick(WINDOW_S)
    out = io.StringIO()
    result = DemoResult(report=Path("report.md"))
    rules(Narrator(Console(file=out, width=300), result.lines), result).decided(
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


def test_the_time_a_run_gave_a_restore_is_told_in_tenths_not_to_the_ten_thousandth() -> None:
    """A demo's summary read "the run gave it 12.7546 s": a float's ``:g``, a precision
    the run's own clock (a tick a second) does not have."""
    from slopilot.tuner.local.demo_episodes import Episode, RestoreWatch

    watch = RestoreWatch(SLO, 228.1, "commit", 1, window_s=8.0, hold_s=16.0,
                         min_requests=1, classes=("p0",))
    episode = Episode(1, 150.0, 154.0, "SlopilotTBTP99High[p0,critical]", ("p0",),
                      action="commit", action_at_s=228.1, closed="the end of the run",
                      closed_at_s=240.8546, needs_s=24.0, watch=watch)
    assert episode.describe().endswith(
        "(a restore needs 24 s of windows after the commit; the run gave it 12.8 s)")
