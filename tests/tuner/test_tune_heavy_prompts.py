"""A quiet minute holding a trace's longest prompts is judged as the whole replay's
minutes judge it (``engine/sim/windows``: the heaviest prompts' window).

Found replaying a code assistant's trace that tune was not built around: a minute's P99
over n requests reads its ``n - floor(0.99 (n - 1))``-th slowest, the 2nd of a quiet
minute's ~100, so that minute's P99 is set by its few heaviest requests, not by its
load, and the windows were chosen by load. ``tune`` said a config held; the whole trace's
P99 held too, but a minute of its replay missed, the minute the live alerts would fire on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slopilot.engine.request import Request
from slopilot.engine.sim.summary_view import simulate_json
from tests.support.heavy_minute import HEAVY, write_heavy_minute
from tests.support.tune_replay import tune_and_replay


class FirstTokens:
    """Each request's TTFT by its arrival: the whole replay's minutes, read afterwards."""

    def __init__(self) -> None:
        self.ttft: list[tuple[float, float]] = []

    def on_step(self, *_: object) -> None:
        pass

    def on_first_token(self, req: Request, ttft_s: float, now: float) -> None:
        self.ttft.append((req.arrival_time, ttft_s))

    def on_token_gap(self, *_: object) -> None:
        pass

    def on_finished(self, *_: object) -> None:
        pass

    def worst_minute_ms(self) -> float:
        """The highest P99 TTFT of a minute, on a 10 s grid (as the live alerts judge)."""
        at = np.array([a for a, _ in self.ttft])
        ttft = np.array([t for _, t in self.ttft])
        return max(float(np.percentile(ttft[(at >= s) & (at < s + 60.0)], 99)) * 1000
                   for s in np.arange(0.0, at.max() - 60.0, 10.0)
                   if ((at >= s) & (at < s + 60.0)).any())


def test_a_quiet_minute_of_long_prompts_is_judged_as_the_whole_replay_judges_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # What check_command runs, the whole trace, read by the minute as the alerts read it.
    seen = FirstTokens()
    run = tune_and_replay(write_heavy_minute(tmp_path / "heavy.csv"), capsys, (seen,))
    out, scenario, whole = run.out, run.scenario, run.whole
    # The whole trace's P99 dilutes the long prompts among ~1,000 requests; a minute does not.
    assert simulate_json(whole.summary, scenario.slo)["p99_within_slo"] is True
    limit = scenario.slo.p1.ttft_p99_ms
    assert limit is not None
    assert seen.worst_minute_ms() > limit, "the case needs a minute of the replay that misses"
    assert out["feasible"] is False, out["verdict"]
    # The minute that misses is the long prompts', and a window judged it.
    assert any(w["start_s"] <= HEAVY[0] and w["end_s"] > HEAVY[1] for w in out["windows"]), \
        out["judged_on"]
