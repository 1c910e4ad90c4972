"""How many samples the operator's /metrics holds per tuning CR: what its scrape limit
is sized from (docs/operations.md, "Scrape limits").

The operator serves every tuned deployment's series from one pod, so its page grows with
the CRs: past the Prometheus's sample limit its whole scrape fails and every namespace's
Tuning and Twin rows go empty. The figures here are the ones the docs state; a series
added per CR fails this test until the docs say what it costs. The actions counter's
series are bounded by its label pairs (``reasons.LABEL_PAIRS``: the reason words the
controller writes, each with its actions, and ``other`` for each action), whatever the
reasons' texts, so the per-CR figure is a bound, not an estimate."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from slopilot.engine.request import Priority
from slopilot.engine.sim.shape import FEATURES
from slopilot.operator.metrics_endpoint import serve_metrics
from slopilot.tuner.loop.decision import Action, TrialOutcome
from slopilot.tuner.loop.metrics import TunerMetrics
from slopilot.tuner.loop.reasons import LABEL_PAIRS, WRITTEN_WITH, reason_token
from slopilot.tuner.loop.settings import TwinCorrection
from slopilot.tuner.loop.state import ControllerState
from slopilot.tuner.loop.twin_check import ClassError, TwinCheck
from tests.support.waits import HANG_GUARD_S

DOCS = Path(__file__).parents[2] / "docs" / "operations.md"

FIRST_TICK = 7
"""A CR's samples from its first tick: one state gauge per ControllerState (5), the
replicas asked for, Prometheus's clock offset."""
TRIALS_MOST = len(TrialOutcome)
"""One counter per trial outcome the CR has seen."""
TWIN_MOST = 1 + 2 + 2 * len(Priority) + len(FEATURES)
"""trusted, the step-time errors as given and corrected, TTFT and TBT P99 errors per
class, a correction factor per cost-model feature (REFIT; one for RESCALE)."""
STATUS_WRITES_MOST = 1
"""The status writes the API server failed (deployment_loop.py)."""
MOST_BESIDES_ACTIONS = FIRST_TICK + TRIALS_MOST + TWIN_MOST + STATUS_WRITES_MOST
ACTIONS_MOST = len(LABEL_PAIRS)
"""One counter per (action, reason) label pair: the table's, and "other" per action."""
PER_CR = MOST_BESIDES_ACTIONS + ACTIONS_MOST
CRS = 60
ARBITRARY = ["chat_prod: its model", "Qwen_instruct holds", "SlopilotTTFTHigh fired",
             "kv_watermark at its bound", "ConnectionError: refused", "backoff", "steady",
             "12 replicas asked for", "x" * 80, ""]
"""Reasons no table word starts: names users write, alerts', knobs', exceptions', figures."""


def _samples(metrics: TunerMetrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _first_tick(metrics: TunerMetrics, crs: int) -> None:
    """As the daemons drive one operator's series: each CR's controller in its own
    namespace's view (``daemon.operator_metrics``), its first Prometheus read and tick."""
    for i in range(crs):
        view = metrics.in_namespace(f"team-{i % 7}")
        view.clock(f"chat-{i}", 0.25)
        view.action(f"chat-{i}", Action.NONE, "steady")
        view.observe(f"chat-{i}", ControllerState.STEADY, 1)


def _busiest_twin() -> TwinCheck:
    classes = tuple(ClassError(p.label, 120.0, 100.0, 22.0, 20.0) for p in Priority)
    return TwinCheck(at=600.0, window_s=300.0, step_error=0.1, corrected_error=0.02,
                     correction=TwinCorrection.REFIT, classes=classes, trusted=True,
                     reason="within bound", factors={f: 1.1 for f in FEATURES})


def test_a_cr_costs_its_first_tick_samples_and_no_created_ones() -> None:
    metrics = TunerMetrics()
    _first_tick(metrics, CRS)
    samples = _samples(metrics)
    assert len(samples) == FIRST_TICK * CRS, len(samples) / CRS
    # Counters carry no _created sample: nothing reads one, and it doubled each.
    for view, i in ((metrics.in_namespace("team-0"), 0), (metrics.in_namespace("team-1"), 1)):
        view.trial(f"chat-{i}", TrialOutcome.COMPLETE)
        view.action(f"chat-{i}", Action.RETUNE, "alert SlopilotTTFTP99High")
    samples = _samples(metrics)
    assert len(samples) == FIRST_TICK * CRS + 4
    assert not [s for s in samples if "_created" in s]


def test_a_cr_costs_at_most_its_documented_samples_whatever_its_reasons() -> None:
    metrics = TunerMetrics()
    _first_tick(metrics, CRS)
    for i in range(CRS):
        view = metrics.in_namespace(f"team-{i % 7}")
        for outcome in TrialOutcome:
            view.trial(f"chat-{i}", outcome)
        for action in Action:  # every word with every action, and texts of no word
            for reason in [*(f"{w.value} {i}: said" for w in WRITTEN_WITH), *ARBITRARY,
                           f"chat-{i}: {action}"]:
                view.action(f"chat-{i}", action, reason)
        view.twin(f"chat-{i}", _busiest_twin())
        view.status_write_failed(f"chat-{i}")
        view.status_write_failed(f"chat-{i}")
    assert len(_samples(metrics)) == PER_CR * CRS
    # A deleted CR's series go with it (deployment_loop: forget).
    metrics.in_namespace("team-0").forget("chat-0")
    assert len(_samples(metrics)) == PER_CR * (CRS - 1)


def test_a_few_actions_cost_one_sample_per_action_and_reason_word() -> None:
    metrics = TunerMetrics()
    _first_tick(metrics, CRS)
    pairs = [(Action.RETUNE, "alert SlopilotTTFTP99High fired"), (Action.TRIAL, "trial 3"),
             (Action.TRIAL, "trial 4"), (Action.COMMIT, "commit: trial 3"),
             (Action.SCALE, "scale_up 1->2"), (Action.HOLD, "trial_rate_limit: 4")]
    for i in range(CRS):
        view = metrics.in_namespace(f"team-{i % 7}")
        for action, reason in pairs:
            view.action(f"chat-{i}", action, reason)
    assert len(_samples(metrics)) == (FIRST_TICK + 5) * CRS  # trial 3 and 4: one series


def test_the_page_prometheus_negotiates_has_no_created_samples_either() -> None:
    """Prometheus asks for OpenMetrics first: its page carries the same samples."""
    metrics = TunerMetrics()
    _first_tick(metrics, 3)
    metrics.in_namespace("team-0").trial("chat-0", TrialOutcome.PRUNED)
    server = serve_metrics(("127.0.0.1", 0), registry=metrics.registry)
    try:
        text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics",
                         headers={"Accept": OPENMETRICS}, timeout=HANG_GUARD_S).text
    finally:
        server.close()
    assert text == openmetrics_latest(metrics.registry).decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == FIRST_TICK * 3 + 1
    assert "_created" not in text


@pytest.mark.parametrize("figure", [
    f"{FIRST_TICK} samples per tuning CR",
    f"at most {MOST_BESIDES_ACTIONS}",
    f"{TWIN_MOST} for the twin",
    f"{len(WRITTEN_WITH)} reason words",
    f"{ACTIONS_MOST} action/reason pairs",
    f"at most {PER_CR} samples per tuning CR",
])
def test_the_docs_state_these_figures(figure: str) -> None:
    text = " ".join(DOCS.read_text().split())
    assert figure in text, f"docs/operations.md should say {figure!r} (Scrape limits)"


def test_a_reason_written_with_a_figure_or_a_name_first_makes_no_series_per_value() -> None:
    metrics = TunerMetrics().in_namespace("team-a")
    for n in range(50):
        metrics.action("chat", Action.SCALE, f"{n} replicas asked for")
        metrics.action("chat", Action.HOLD, "x" * (41 + n))
        metrics.action("chat", Action.INFORM, f"tenant_model_{chr(97 + n % 26)}: ready")
    assert {line.split('reason="')[1].split('"')[0] for line in _samples(metrics)
            if 'reason="' in line} == {"other"}
    assert reason_token("scale_up 1->2: alert SlopilotTTFTP99High") == "scale_up"
    assert reason_token("commit: trial 3") == "commit"
