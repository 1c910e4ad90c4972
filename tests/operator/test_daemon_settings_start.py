"""The daemon's own settings (``$SLOPILOT_SIM_WORKERS``, ``..._PER_NAMESPACE``,
``$SLOPILOT_CONTROLLER_TICK_S``, ``$SLOPILOT_BASE_SCENARIO``) are checked when
``slopilot operator`` starts, as the policy is: read only when a CR's controller was
built, a bad one passed the start and then failed every tuning CR at every step
(``Tuning=False``, its study read again each time); a tick of ``inf`` stepped each
daemon once and never again. A blank value is unset, as the policy's are, and a number
of thousands of digits is refused naming its variable (``int`` gave Python's own message,
or a bare ValueError the loop did not catch)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.operator.daemon import (
    BASE_SCENARIO_ENV,
    SIM_WORKERS_ENV,
    SIM_WORKERS_PER_NAMESPACE_ENV,
    TICK_ENV,
    check_daemon_settings,
    sim_workers,
    tick_interval,
)
from slopilot.operator.policy import MAX_TRIALS_PER_HOUR_ENV
from slopilot.tuner.loop.errors import ControllerError

HUGE = "9" * 5000


@pytest.mark.parametrize(("name", "raw"), [
    (SIM_WORKERS_ENV, "0"), (SIM_WORKERS_ENV, HUGE), (SIM_WORKERS_PER_NAMESPACE_ENV, "0"),
    (TICK_ENV, "inf"), (TICK_ENV, "nan"), (TICK_ENV, "0.001"), (TICK_ENV, HUGE),
    (BASE_SCENARIO_ENV, "nonexistent"), (MAX_TRIALS_PER_HOUR_ENV, HUGE),
    ("SLOPILOT_PROMETHEUS_MIB_PER_MIN", "0")])
def test_a_bad_daemon_setting_stops_the_start_naming_it(
        name: str, raw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        kopf_runs: list[Callable[[threading.Event], None]]) -> None:
    monkeypatch.setenv(name, raw)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "never-read"))
    with pytest.raises(SystemExit) as exited:
        main(["operator", "-A", "--standalone"])
    message = exited.value.code
    assert isinstance(message, str) and f"{name}=" in message, message
    assert len(message) < 600 and "KUBECONFIG" not in message, message
    assert kopf_runs == []


@pytest.mark.parametrize("name", [SIM_WORKERS_ENV, TICK_ENV, BASE_SCENARIO_ENV])
def test_a_blank_daemon_setting_is_unset(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "")
    check_daemon_settings()
    assert sim_workers() == 1 and tick_interval() == 5.0


@pytest.mark.parametrize("raw", [HUGE, "1e400"])
def test_a_number_too_long_for_int_is_the_settings_own_error(
        raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIM_WORKERS_ENV, raw)
    with pytest.raises(ControllerError, match=f"{SIM_WORKERS_ENV}="):
        sim_workers()


def test_the_prometheus_budget_is_the_administrators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace of many large deployments may need more than the shipped 16 MiB of
    answers a minute: ``$SLOPILOT_PROMETHEUS_MIB_PER_MIN`` sets it (a bad value stops
    the start, above), and the namespaces' budgets are made with it."""
    from slopilot.operator.daemon import PROMETHEUS_BUDGET_ENV, prometheus_bytes_per_min
    from slopilot.tuner.prometheus.answer_budget import NAMESPACE_BYTES_PER_MIN

    assert prometheus_bytes_per_min() == NAMESPACE_BYTES_PER_MIN
    monkeypatch.setenv(PROMETHEUS_BUDGET_ENV, "64")
    check_daemon_settings()
    assert prometheus_bytes_per_min() == 64 * 2**20
    for raw in ("0", "-1", "1.5", "lots", HUGE):
        monkeypatch.setenv(PROMETHEUS_BUDGET_ENV, raw)
        with pytest.raises(ControllerError, match=f"{PROMETHEUS_BUDGET_ENV}="):
            check_daemon_settings()
