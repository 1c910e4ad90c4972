"""A real engine's scrapes, written into a real Prometheus's TSDB (``promtool tsdb
create-blocks-from openmetrics``) at the timestamps a test chooses.

A live scrape lands where Prometheus's clock says; a backfill lands where the test says,
so a test can hold a history whose present is Prometheus's own now and read it on
another clock (``tests/tuner/test_prometheus_clock.py``). The series are what
``EngineMetrics`` renders for the requests the test says finished, each second.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

from slopilot.engine.metrics import EngineMetrics
from slopilot.engine.request import Priority
from slopilot.engine.slo import SLOSpec
from tests.support.prometheus import PrometheusBinaries, promtool

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$")


def steady_scrapes(slo: SLOSpec, *, t0: float, end_s: int, scrape_s: int,
                   per_class_rate: int, ttft_s: Callable[[int], float],
                   labels: str, busy: float = 0.5) -> list[str]:
    """OpenMetrics sample lines of one replica scraped every ``scrape_s`` from ``t0`` to
    ``t0 + end_s``: ``per_class_rate`` requests of P0 and of P1 finish each second, with
    the TTFT ``ttft_s(second)`` (jittered 10 %), ten tokens 20 ms apart, and the meter's
    verdict against ``slo``; its executor runs ``busy`` of each second
    (``slopilot_busy_ratio``). ``labels``: the target's, on every series."""
    second = 0
    # The engine's own clock is the history's: its sliding gauges (the busy ratio, the
    # decode stall) read the seconds fed to them, not the test's monotonic clock.
    metrics = EngineMetrics("m", clock=lambda: float(second))
    metrics.set_slo(slo)
    jitter = random.Random(1)
    lines: list[str] = []
    for second in range(end_s + 1):
        for p in (Priority.P0, Priority.P1) if second else ():
            for _ in range(per_class_rate):
                ttft = ttft_s(second) * jitter.uniform(0.9, 1.1)
                metrics.on_first_token(p, ttft, 1, prompt_tokens=100)
                for _ in range(9):
                    metrics.on_token_gap(p, 0.02, float(second))
                metrics.on_finished(p, e2e_s=ttft + 0.2, queue_s=0.01, prompt_tokens=100,
                                    generation_tokens=10, finish_reason="stop",
                                    decode_s=0.2, inference_s=ttft + 0.2, prefill_s=ttft)
                cls = slo.class_slo(p)
                met = cls.ttft_p99_ms is None or ttft * 1000 <= cls.ttft_p99_ms
                metrics.observe_verdict(p, cls, met=met, tokens=10)
        metrics.on_step(now=float(second), elapsed_s=busy, num_running=3, num_waiting=0,
                        num_swapped=0, kv_usage=0.1, iteration_tokens=4,
                        num_preempted_recompute=0, num_preempted_swap=0, swap_s=0.0,
                        prefix_queries=0, prefix_hits=0)
        if second % scrape_s:
            continue
        at = t0 + second
        lines.append(f"up{{{labels}}} 1 {at:.3f}")
        for line in metrics.render().decode().splitlines():
            found = _SAMPLE.match(line)
            if line.startswith("#") or found is None or found[1].endswith("_created"):
                continue
            inner = f"{labels},{found[2]}" if found[2] else labels
            lines.append(f"{found[1]}{{{inner}}} {found[3]} {at:.3f}")
    return lines


def backfill(binaries: PrometheusBinaries, lines: list[str], data: Path) -> None:
    """Write ``lines`` into the TSDB at ``data`` (a server started on it reads them)."""
    def series_then_time(line: str) -> tuple[str, float]:
        series, _, at = line.rsplit(" ", 2)
        return series, float(at)

    # OpenMetrics wants each series' samples together and in time order.
    text = "\n".join(sorted(lines, key=series_then_time)) + "\n# EOF\n"
    source = data.parent / "backfill.om"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    done = promtool(binaries, "tsdb", "create-blocks-from", "openmetrics", source, data)
    if done.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from failed: {done.stderr[-2000:]}")
