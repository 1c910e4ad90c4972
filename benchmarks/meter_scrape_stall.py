"""What a /metrics scrape of the meter costs the token streams it relays.

The meter in front of a vLLM engine (``slopilot meter``) answers ``GET /metrics`` with
vLLM's exposition, then its own part: the verdict counters, its client-side TTFT and
token-gap histograms (the dense ``TOKEN_LATENCY_BUCKETS`` edges, 137 lines each) and the
replays. It renders its part on the event loop that relays every stream's chunks, so
while it renders, no stream gets its next token. The form is ``scrape_stall.py``'s: one
``slopilot serve --executor simulated`` (its 10 ms decode step in real time) stands in
for vLLM, and two meters of this tree front it, each its own process: one as it is
(``tree``), one rendering its part with prometheus_client's ``generate_latest`` over the
same collectors (``generic``: the render before ``metrics_text`` rendered the meter's
histograms). ``--streams`` concurrent streams go through one meter at a time in four
arms, the order turning round by round:

- ``none_tree``, ``none_generic``: the streams alone;
- ``scrape_tree``, ``scrape_generic``: the same while a process of its own GETs the
  meter's /metrics every ``--cadence-s`` (each scrape also fetches, and so stalls, the
  upstream's /metrics: alike in both arms).

Per arm, the medians over ``--rounds`` of each round's token-gap P50, P99 and max as the
client measured them, and the meter's own P99 of its
``slopilot_client_inter_token_latency_seconds`` over the round (what the rules read on a
vLLM deployment, stretched by the stall too); per render, the scrape arm's excess over
the other, and the scrapes' median round trip. Also, in this process: the meter's own
part rendered both ways (both histograms populated and changed since the render
before, as under load: the median of 50).

    .venv/bin/python benchmarks/meter_scrape_stall.py [--streams 16] [--seconds 6]
        [--rounds 5] [--cadence-s 0.25] [--tokens 200]

Ends with ``RESULT`` and the keys of ``scrape_stall.py``'s, the meter's histogram's
P99 named ``meter_tbt_p99_ms_ARM`` and ``meter_tbt_p99_excess_ms_RENDER``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest

from slopilot.engine.meter.client_latency import CLIENT_TBT
from slopilot.engine.meter.proxy import Meter
from slopilot.engine.meter.slo_watch import SLOWatch
from slopilot.engine.request import Priority
from slopilot.engine.verdicts import Verdicts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from meter_truth import meter  # noqa: E402
from scrape_stall import RENDERS, arguments, result_line, side_by_side  # noqa: E402
from serving_latency import serve  # noqa: E402

# Generous: every stream meets it, so each round counts the same verdict series.
SLO = {"classes": {"p0": {"ttftP99Ms": 60000, "tbtP99Ms": 60000}}}
# ``slopilot meter`` with the render of before: prometheus_client's whole encoder.
GENERIC_METER = r"""
import sys
from prometheus_client import generate_latest
from slopilot.cli import main
from slopilot.engine.meter.proxy import Meter
Meter.render = lambda self: generate_latest(self.registry)
sys.exit(main(sys.argv[1:]))
"""


def render_ms(render: str, slo_file: Path) -> float:
    """The meter's own part, both histograms populated and changed since the render
    before (nothing kept from it), a served model named."""
    m = Meter("http://127.0.0.1:1", SLOWatch(slo_file, Verdicts()), Priority.P0)
    m.model_name = "m"
    slo = m.slo.current().class_slo(Priority.P0)
    for i in range(200):
        m.latency.first_token(0.001 * (i + 1))
        for _ in range(10):
            m.latency.token_gap(0.0001 * (i + 1))
        m.verdicts.observe(Priority.P0, slo, met=i % 4 != 0, tokens=i)
    fn = m.render if render == "tree" else lambda: generate_latest(m.registry)
    times = []
    for i in range(50):
        m.latency.first_token(0.002 * (i + 1))
        m.latency.token_gap(0.0003 * (i + 1))
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    args = arguments(__doc__.split("\n\n")[0])
    with tempfile.TemporaryDirectory() as tmp:
        slo_file = Path(tmp) / "slo.json"
        slo_file.write_text(json.dumps(SLO))
        with serve("--executor", "simulated") as upstream, \
                meter(upstream, slo_file) as tree, \
                meter(upstream, slo_file, launcher=("-c", GENERIC_METER)) as generic:
            results = side_by_side({"tree": tree.url, "generic": generic.url}, args,
                                   CLIENT_TBT)
        renders = {r: render_ms(r, slo_file) for r in RENDERS}
    print(result_line(results, renders, "meter_tbt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
