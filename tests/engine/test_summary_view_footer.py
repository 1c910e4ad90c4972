"""The lines under a run's table (``summary_view.footer``), as a report's reader reads them."""

from __future__ import annotations

from slopilot.engine.sim.summary_view import footer
from tests.support.summaries import figures, window


def test_a_window_that_did_not_measure_busy_does_not_read_as_idle_replicas() -> None:
    """A live window (the demo's, the loop's Prometheus windows) has no busy ratio: the
    report said "busy per replica 0% mean, 0% max" under a table of replicas serving
    119 tok/s."""
    live = window({"p1": figures(300.0, 30.0, 119.0)})
    assert live.busy_ratio is None
    line = footer(live, definitions=False)[0]
    assert "0%" not in line
    assert "busy per replica not measured" in line


def test_a_measured_busy_ratio_is_printed_as_before() -> None:
    import dataclasses

    sim = dataclasses.replace(window({"p1": figures(300.0, 30.0, 119.0)}),
                              busy_ratio=0.86, busy_ratio_max=0.9)
    assert "busy per replica 86% mean, 90% max" in footer(sim, definitions=False)[0]
