"""The twin check reaches the LLMDeployment: status.twin (in the CRD schema) and an event."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from slopilot.operator import tuning_daemon
from slopilot.operator.tuning_daemon import post_decision, status_after
from slopilot.tuner.loop.state import TwinCorrection
from tests.operator.test_crd import errors_of, sample
from tests.tuner.test_twin_check import WINDOW_S, plant


@pytest.mark.parametrize("correction", [TwinCorrection.REFIT, TwinCorrection.NONE])
def test_the_twin_check_is_written_to_status_and_posted(
        correction: TwinCorrection, monkeypatch: pytest.MonkeyPatch) -> None:
    p = plant(twin_correction=correction)
    d = p.ctl.tick(WINDOW_S)
    body = sample("llmdeployment-builtin.yaml")
    body["metadata"] = {"name": "demo", "namespace": "team-a", "generation": 1}
    status = status_after(body, p.ctl, d, "2026-12-01T00:00:00Z")
    twin = status["twin"]
    assert twin["trusted"] is (correction is TwinCorrection.REFIT)
    assert twin["classes"]["p0"]["ttftP99MeasuredMs"] > 0
    assert twin["stepTimeError"] < -0.2
    assert errors_of({**body, "status": status}) == []

    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "info", lambda _b, *, reason, message: posted.append(
        ("info", reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda _b, *, reason, message: posted.append(
        ("warn", reason, message)))
    post_decision(body, d)
    kinds = {(level, reason) for level, reason, _ in posted}
    expected = ("info", "TwinChecked") if twin["trusted"] else ("warn", "TwinUntrusted")
    assert expected in kinds
    assert any(twin["reason"] in message for _, _, message in posted)


def test_a_tick_without_a_check_posts_no_twin_event(monkeypatch: pytest.MonkeyPatch) -> None:
    p = plant()
    p.ctl.tick(WINDOW_S)
    d = p.ctl.tick(WINDOW_S + 15)  # the trial runs: nothing asked of the twin
    assert d.twin is None
    posted: list[Any] = []
    monkeypatch.setattr(tuning_daemon.kopf, "info", lambda *a, **k: posted.append(k))
    monkeypatch.setattr(tuning_daemon.kopf, "warn", lambda *a, **k: posted.append(k))
    post_decision({"metadata": {}}, d)
    assert posted == []


def test_the_twin_bound_and_correction_come_from_spec_twin() -> None:
    from slopilot.operator.crd import openapi_schema
    from slopilot.operator.daemon import controller_settings
    from slopilot.operator.spec import parse_spec
    from tests.support.crd_schema import apply_defaults

    body = sample("llmdeployment-builtin.yaml")
    defaults = parse_spec(apply_defaults(openapi_schema(), body))
    settings = controller_settings(defaults, "team-a", "chat")
    assert (settings.twin_max_error, settings.twin_correction) == (0.15, TwinCorrection.REFIT)
    body["spec"]["twin"] = {"maxError": 0.3, "correction": "rescale"}
    assert errors_of(body) == []
    settings = controller_settings(parse_spec(apply_defaults(openapi_schema(), body)),
                                   "team-a", "chat")
    assert (settings.twin_max_error, settings.twin_correction) == (0.3, TwinCorrection.RESCALE)
