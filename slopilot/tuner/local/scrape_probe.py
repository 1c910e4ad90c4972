"""The demo's workload probe without Prometheus: the live workload from the direct scrape.

``PrometheusProbe``'s twin over ``DirectScrape``'s samples: the last ``window_s`` of every
replica's series (``DirectScrape.workload``), profiled by the function that profiles
PromQL's increases (``WorkloadProfile.from_increases``), on the base scenario's hardware.
The base scenario alone was no probe: its first seconds are the designed load before any
shift, and the twin check, the warm starts and the capacity plans simulated those while
the replicas served another.
"""

from __future__ import annotations

from slopilot.engine.sim.scenario import Scenario
from slopilot.tuner.local.scrape import DirectScrape
from slopilot.tuner.prometheus.profiling import WorkloadProfile, check_probe, profiled_or_base


class ScrapeProbe:
    """WorkloadProbe: the last ``window_s`` of traffic the scrape saw, as ``base``'s
    hardware under it.

    Too little traffic to profile (a quiet deployment, or a scrape younger than the
    window) or figures no engine exports give ``base`` itself, as ``PrometheusProbe``
    does; no replica answering the scrape raises PrometheusUnavailable.
    """

    def __init__(self, scrape: DirectScrape, base: Scenario, *, window_s: int = 60,
                 duration_s: float = 60.0, min_requests: int = 10) -> None:
        check_probe(window_s, duration_s)
        self.scrape, self.base = scrape, base
        self.window_s, self.duration_s, self.min_requests = window_s, duration_s, min_requests

    def measure(self, now: float) -> Scenario:
        increases = self.scrape.workload(now - self.window_s, now)
        return profiled_or_base(lambda: WorkloadProfile.from_increases(
            increases, self.window_s, min_requests=self.min_requests),
            self.base, self.duration_s)
