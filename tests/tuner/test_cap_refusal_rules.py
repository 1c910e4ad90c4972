"""Requests refused at the connection cap (``--max-connections``), as the operator's rules
read them under promtool.

The built-in engine counts such a request for generation in
``slopilot_requests_refused_total``, as a 429 (its TTFT's +Inf: ``test_refused_live``);
the meter in front of vLLM counts it in ``slopilot_meter_refused_total``, which vLLM's
own histogram and the meter's read as a first token never given. The reviewer's case: 16
of 20 P0 streams refused at the cap, the 4 served within P0's 100 ms: the P99 read met,
and no alert fired, while most clients got a 503.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.meter.client_latency import CLIENT_TTFT
from slopilot.engine.meter.exposition import METER_REFUSED
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries
from tests.tuner.test_stall_alerts import TTFT, ident, labels, rules_file, run, ttft_alerts


def _served_within_target(histogram: str) -> list[dict[str, str]]:
    """P0's 4 first tokens each 15 s, all within 0.1 s (P0's target), for 10 minutes."""
    p0 = labels(priority_class="p0")
    return [*({"series": f'{histogram}_bucket{labels(priority_class="p0", le=le)}',
               "values": "0+4x40"} for le in ("0.1", "300.0", "+Inf")),
            {"series": f"{histogram}_count{p0}", "values": "0+4x40"}]


@pytest.mark.prometheus
def test_streams_the_meter_refused_at_its_cap_are_first_tokens_never_given(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    files = [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                        {"profile": "standard", "vllmClass": "p0"})]
    series = [*_served_within_target(CLIENT_TTFT), *_served_within_target(TTFT),
              {"series": f"{METER_REFUSED}{labels(priority_class='p0')}",
               "values": "0+16x40"}]
    p99 = {"expr": 'slopilot:ttft_seconds:p99{priority_class="p0"}', "eval_time": "6m",
           "exp_samples": [{"labels": "slopilot:ttft_seconds:p99{" + ",".join(
               f'{k}="{v}"' for k, v in ident(priority_class="p0").items()) + "}",
                            "value": 300}]}
    checks = [{"eval_time": at, "alertname": "SlopilotTTFTP99High",
               "exp_alerts": ttft_alerts()} for at in ("6m", "9m")]
    run(prometheus_binaries, tmp_path, files, series, checks, [p99])


@pytest.mark.prometheus
def test_without_refusals_the_same_streams_meet_p0s_target(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The control: the 4 served alone read within 0.1 s, and fire nothing."""
    files = [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                        {"profile": "standard", "vllmClass": "p0"})]
    series = [*_served_within_target(CLIENT_TTFT), *_served_within_target(TTFT),
              {"series": f"{METER_REFUSED}{labels(priority_class='p0')}", "values": "0x40"}]
    checks = [{"eval_time": at, "alertname": "SlopilotTTFTP99High", "exp_alerts": []}
              for at in ("6m", "9m")]
    run(prometheus_binaries, tmp_path, files, series, checks)
