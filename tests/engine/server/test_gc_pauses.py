"""The server process's garbage-collector pauses on /metrics."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest

from slopilot.engine.server.gc_pauses import GCPauses


def test_every_collection_is_timed_by_generation_while_installed() -> None:
    registry = CollectorRegistry()
    pauses = GCPauses().install(registry)
    try:
        gc.collect(0)
        gc.collect(2)
        text = generate_latest(registry).decode()
    finally:
        pauses.uninstall(registry)
    assert pauses.recorders[0].count >= 1 and pauses.recorders[2].count >= 1
    assert pauses.recorders[2].total > 0
    assert 'slopilot_gc_pause_seconds_count{generation="2"}' in text
    assert 'slopilot_gc_pause_seconds_bucket{generation="0",le="0.02"}' in text
    seen = pauses.recorders[2].count
    gc.collect(2)  # uninstalled: no longer timed, and the registry no longer has it
    assert pauses.recorders[2].count == seen and pauses not in gc.callbacks
    assert "slopilot_gc_pause_seconds" not in generate_latest(registry).decode()
