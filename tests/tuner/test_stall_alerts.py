"""A deployment that serves no first token, or that Prometheus cannot scrape, keeps alerting.

The operator's own rules (``desired_objects``, as a cluster gets them) under promtool, on
the series an engine exports while it happens:

- a stall: first tokens stop, requests wait, their clients give up. A request whose
  client left before its first token is one never given, as a refusal is: counted in the
  TTFT P99's +Inf bucket (the built-in engine's count, the meter's on vLLM), so the P99
  does not go NaN and its alerts do not clear; and a replica with requests in flight that
  makes no token fires ``SlopilotEngineStalled``.
- a scrape gap, or targets gone: ``SlopilotTargetsDown``, where every other alert reads
  no data and clears.

Each alert reads the deployment's own series only: another tenant's, or one without the
enforced namespace label, fires nothing here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.meter.client_latency import CLIENT_ABANDONED, CLIENT_TTFT
from slopilot.engine.metric_names import ABANDONED
from slopilot.operator.reconcile import desired_objects
from slopilot.operator.spec import parse_spec
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"
TTFT = "vllm:time_to_first_token_seconds"


def rules_file(workdir: Path, sample: str, namespace: str, slo: dict[str, Any], *,
               annotations: bool = False) -> str:
    """The PrometheusRule the operator renders for ``sample`` as ``namespace/chat``, as a
    rules file in ``workdir``; its name. Without the alerts' annotations unless asked
    (promtool then compares them too)."""
    body = copy.deepcopy(yaml.safe_load((SAMPLES / sample).read_text()))
    body["metadata"] = {"name": "chat", "namespace": namespace, "uid": f"{namespace}-uid"}
    body["spec"]["slo"] = slo
    objects = desired_objects(body, parse_spec(body), replicas=1, monitoring=True,
                              operator_namespace="slopilot", namespace_label="namespace",
                              dcgm_namespace="gpu-operator")
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    if not annotations:
        for r in rule["spec"]["groups"][0]["rules"]:
            r.pop("annotations", None)
    name = f"{namespace}-rules.yaml"
    (workdir / name).write_text(yaml.safe_dump(rule["spec"], sort_keys=False, width=200))
    return name


def labels(namespace: str = "team-a", **extra: str) -> str:
    own = {"slopilot_namespace": namespace, "namespace": namespace,
           "slopilot_deployment": "chat", "instance": "a", **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in own.items()) + "}"


def ident(namespace: str = "team-a", **extra: str) -> dict[str, str]:
    return {"slopilot_namespace": namespace, "namespace": namespace,
            "slopilot_deployment": "chat", **extra}


def run(binaries: PrometheusBinaries, workdir: Path, files: list[str],
        series: list[dict[str, str]], alerts: list[dict[str, Any]],
        exprs: list[dict[str, Any]] | None = None, interval: str = "15s") -> None:
    test = {"rule_files": files, "evaluation_interval": "30s",
            "tests": [{"interval": interval, "input_series": series,
                       "alert_rule_test": alerts, "promql_expr_test": exprs or []}]}
    (workdir / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool(binaries, "test", "rules", "test.yaml", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr


def ttft_alerts(namespace: str = "team-a") -> list[dict[str, Any]]:
    return [{"exp_labels": {"severity": "warning", "action": "inform", "priority_class": "p0",
                            **ident(namespace)}},
            {"exp_labels": {"severity": "critical", "action": "retune",
                            "priority_class": "p0", **ident(namespace)}}]


STALLED = {"exp_labels": {"severity": "critical", "action": "hold", "priority_class": "all",
                          **ident()}}
DOWN = {"exp_labels": {"severity": "critical", "action": "hold", "priority_class": "all",
                       **ident()}}


def first_tokens_then_none(histogram: str, namespace: str = "team-a"
                           ) -> list[dict[str, str]]:
    """P0's first tokens in ``histogram``, all in (1, 2] s for 5 minutes (60 each 15 s),
    then none."""
    def bucket(le: str, values: str) -> dict[str, str]:
        return {"series": f'{histogram}_bucket{labels(namespace, priority_class="p0", le=le)}',
                "values": values}
    return [bucket("1.0", "0x40"), bucket("2.0", "0+60x20 1200x20"),
            bucket("+Inf", "0+60x20 1200x20")]


def stall_series(namespace: str = "team-a") -> list[dict[str, str]]:
    """The reviewer's stall, as the built-in engine exports it: P0's first tokens all in
    (1, 2] s for 5 minutes (60 each 15 s), then none; 400 requests wait, and from 5m
    their clients give up, 60 each 15 s, before a first token (no 429: the queue holds
    them); no token is made after 5m."""
    p0 = labels(namespace, priority_class="p0")
    return [
        *first_tokens_then_none(TTFT, namespace),
        {"series": f"slopilot_requests_refused_total{p0}", "values": "0x40"},
        {"series": f"{ABANDONED}{p0}", "values": "0x20 0+60x20"},
        {"series": f"vllm:generation_tokens_total{labels(namespace)}",
         "values": "0+6000x20 120000x20"},
        {"series": f"vllm:num_requests_waiting{labels(namespace)}", "values": "0x20 400x20"},
        {"series": f"vllm:num_requests_running{labels(namespace)}", "values": "8x40"},
        {"series": f"slopilot_busy_ratio{labels(namespace)}", "values": "0.9x40"},
    ]


@pytest.mark.prometheus
def test_a_stalled_builtin_engine_keeps_its_ttft_alerts_and_fires_the_stall_alert(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard", "prefixHitMin": 0.9})]
    checks = [{"eval_time": "4m", "alertname": "SlopilotTTFTP99High",
               "exp_alerts": ttft_alerts()},
              {"eval_time": "4m", "alertname": "SlopilotEngineStalled", "exp_alerts": []}]
    for at in ("8m", "10m30s"):  # no client gets a first token: nothing clears
        checks += [{"eval_time": at, "alertname": "SlopilotTTFTP99High",
                    "exp_alerts": ttft_alerts()},
                   {"eval_time": at, "alertname": "SlopilotEngineStalled",
                    "exp_alerts": [STALLED]}]
    # The P99 falls among the requests never given a first token: the highest finite
    # edge, as for refusals.
    p99 = [{"expr": 'slopilot:ttft_seconds:p99{priority_class="p0"}', "eval_time": "8m",
            "exp_samples": [{"labels": 'slopilot:ttft_seconds:p99{'
                                       + ",".join(f'{k}="{v}"' for k, v in
                                                  ident(priority_class="p0").items()) + "}",
                             "value": 2}]}]
    run(prometheus_binaries, tmp_path, files, stall_series(), checks, p99)


@pytest.mark.prometheus
def test_the_reviewers_stall_as_he_wrote_it_keeps_the_stall_alert_firing(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # His series as given: no count of clients gone (an image from before it), aborts
    # only in vllm:request_success_total, and no token counter at all. The TTFT P99 then
    # has nothing to read; the stall alert still fires, and holds.
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard", "prefixHitMin": 0.9})]
    kept = [s for s in stall_series()
            if not s["series"].startswith((ABANDONED, "vllm:generation_tokens_total",
                                           "vllm:num_requests_running"))]
    series = [*kept, {"series": 'vllm:request_success_total'
                                + labels(finished_reason="abort"), "values": "0x20 0+60x20"},
              {"series": f"up{labels()}", "values": "1x40"}]
    checks = [{"eval_time": at, "alertname": name, "exp_alerts": [STALLED] if stalled else []}
              for at in ("8m", "10m30s")
              for name, stalled in (("SlopilotEngineStalled", True),
                                    ("SlopilotTargetsDown", False))]
    run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_a_vllm_deployment_counts_streams_cut_short_before_a_first_token(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # vLLM queues what it cannot run and answers no 429: its clients give up, and the
    # meter counts each stream cut short before its first token. From 5m the meter saw
    # no first token at all: the P99 is its, not vLLM's own (which saw none either).
    files = [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                        {"profile": "standard", "vllmClass": "p0"})]
    p0 = labels(priority_class="p0")
    series = [
        *first_tokens_then_none(CLIENT_TTFT),
        {"series": f"{CLIENT_TTFT}_count{p0}", "values": "0+60x20 1200x20"},
        {"series": f"{CLIENT_ABANDONED}{p0}", "values": "0x20 0+60x20"},
        {"series": f'{TTFT}_bucket{labels(priority_class="p0", le="1.0")}',
         "values": "0+60x20 1200x20"},
        {"series": f'{TTFT}_bucket{labels(priority_class="p0", le="+Inf")}',
         "values": "0+60x20 1200x20"},
        {"series": f"{TTFT}_count{p0}", "values": "0+60x20 1200x20"},
    ]
    checks = [{"eval_time": at, "alertname": "SlopilotTTFTP99High",
               "exp_alerts": ttft_alerts()} for at in ("4m", "8m", "10m30s")]
    run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_a_vllm_stall_the_meter_saw_no_first_token_of_reads_vllms_last_edge(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """From 5m no first token, and streams cut short past the target: the meter saw no
    first token in the window, so the P99 is vLLM's own histogram's with them in its
    +Inf, at its last finite edge, 2,560 s (the meter's and the built-in engine's: 300 s;
    docs/operations.md says both)."""
    files = [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                        {"profile": "standard", "vllmClass": "p0"})]
    p0 = labels(priority_class="p0")
    series = [
        {"series": f"{CLIENT_TTFT}_count{p0}", "values": "0+60x20 1200x20"},
        {"series": f"{CLIENT_ABANDONED}{labels(priority_class='p0', within_ttft_target='false')}",
         "values": "0x20 0+60x20"},
        *({"series": f'{TTFT}_bucket{labels(priority_class="p0", le=le)}',
           "values": "0+60x20 1200x20"} for le in ("1.0", "2560.0", "+Inf")),
        {"series": f"{TTFT}_count{p0}", "values": "0+60x20 1200x20"},
    ]
    p99 = {"expr": 'slopilot:ttft_seconds:p99{priority_class="p0"}', "eval_time": "8m",
           "exp_samples": [{"labels": "slopilot:ttft_seconds:p99{" + ",".join(
               f'{k}="{v}"' for k, v in ident(priority_class="p0").items()) + "}",
                            "value": 2560}]}
    run(prometheus_binaries, tmp_path, files, series, [], [p99])


@pytest.mark.prometheus
def test_one_stream_cut_short_beside_bodies_leaves_vllms_p99_to_vllm(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """600 non-streamed requests a minute, all first tokens within 0.1 s (vLLM's own
    histogram: the meter observes streams only), and one stream whose client hung up
    before its first token at 2m. The meter's count of it switched the class to the
    meter's histogram, which held nothing but that one: P0's TTFT P99 read 300 s, the
    critical alert's retune on 1 request in 600 (a reviewer's case). It is one more
    first token never given beside vLLM's 600: the P99 stays within vLLM's 0.1 s."""
    files = [rules_file(tmp_path, "llmdeployment-vllm.yaml", "team-a",
                        {"profile": "standard", "vllmClass": "p0"})]
    p0 = labels(priority_class="p0")
    series = [
        {"series": f'{TTFT}_bucket{labels(priority_class="p0", le="0.1")}',
         "values": "0+150x20"},
        {"series": f'{TTFT}_bucket{labels(priority_class="p0", le="+Inf")}',
         "values": "0+150x20"},
        {"series": f"{TTFT}_count{p0}", "values": "0+150x20"},
        *({"series": f'{CLIENT_TTFT}_bucket{labels(priority_class="p0", le=le)}',
           "values": "0x20"} for le in ("0.1", "300.0", "+Inf")),
        {"series": f"{CLIENT_TTFT}_count{p0}", "values": "0x20"},
        {"series": f"{CLIENT_ABANDONED}{p0}", "values": "0x8 1x12"},
    ]
    # To a microsecond: the rates' float arithmetic leaves a last digit of its own.
    p99 = {"expr": 'round(slopilot:ttft_seconds:p99{priority_class="p0"}, 0.000001)',
           "eval_time": "2m30s",
           "exp_samples": [{"labels": labels(priority_class="p0").replace(',instance="a"', ""),
                            # The 601st, never given, in +Inf: rank 0.99 x 601 of 600
                            # within 0.1 s.
                            "value": 0.099165}]}
    run(prometheus_binaries, tmp_path, files, series, [], [p99])


def tbt_gap(namespace: str = "team-a") -> list[dict[str, str]]:
    """The reviewer's gap: P0's gaps all in (0.05, 0.1] s, its target unscrapeable 4m..7m."""
    p0 = {"priority_class": "p0"}
    return [
        {"series": f'vllm:inter_token_latency_seconds_bucket{labels(namespace, **p0, le="0.05")}',
         "values": "0x16 _x12 0x12"},
        {"series": f'vllm:inter_token_latency_seconds_bucket{labels(namespace, **p0, le="0.1")}',
         "values": "0+600x16 _x12 17400+600x12"},
        {"series": f'vllm:inter_token_latency_seconds_bucket{labels(namespace, **p0, le="+Inf")}',
         "values": "0+600x16 _x12 17400+600x12"},
    ]


@pytest.mark.prometheus
def test_a_scrape_gap_fires_targets_down_where_the_tbt_alert_clears(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard", "prefixHitMin": 0.9})]
    series = [*tbt_gap(), {"series": f"up{labels()}", "values": "1x15 0x12 1x12"}]
    tbt = {"exp_labels": {"severity": "critical", "action": "scale", "priority_class": "p0",
                          **ident()}}
    checks = [{"eval_time": "3m", "alertname": "SlopilotTBTP99High", "exp_alerts": [tbt]},
              {"eval_time": "3m", "alertname": "SlopilotTargetsDown", "exp_alerts": []},
              {"eval_time": "6m", "alertname": "SlopilotTargetsDown", "exp_alerts": [DOWN]},
              {"eval_time": "9m", "alertname": "SlopilotTargetsDown", "exp_alerts": []}]
    run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_targets_gone_fire_targets_down(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # The pods went away: Prometheus marks their series stale, and no ``up`` is left.
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard", "prefixHitMin": 0.9}, annotations=True)]
    series = [{"series": f"up{labels()}", "values": "1x15 stale"}]
    gone = {**DOWN, "exp_annotations": {
        "summary": "team-a/chat: scrape targets down or gone",
        "description": "no scrape target of the deployment left for 2 min: "
                       "its figures are missing, and the alerts that read them have "
                       "cleared. The controller neither retunes nor scales while it fires; "
                       "check the pods and the ServiceMonitor (docs/operations.md, Alerts)."}}
    checks = [{"eval_time": "3m", "alertname": "SlopilotTargetsDown", "exp_alerts": []},
              {"eval_time": "6m", "alertname": "SlopilotTargetsDown", "exp_alerts": [gone]},
              {"eval_time": "10m", "alertname": "SlopilotTargetsDown", "exp_alerts": [gone]}]
    run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_a_deployment_scaled_to_zero_is_not_down(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """``spec.replicas.min: 0`` is allowed, and a Deployment at 0 has no ``up`` left: the
    "none left" branch fired, critical and holding the loop, for as long as it stayed
    there. Where kube-state-metrics says the Deployment asks for 0, nothing fires; where
    it asks for 1, or says nothing, the pods gone fire it as before."""
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    ksm = '{namespace="team-a",deployment="chat"}'
    up = {"series": f"up{labels()}", "values": "1x15 stale"}
    for asked, fired in (("0", []), ("1", [DOWN])):
        series = [up, {"series": f"kube_deployment_spec_replicas{ksm}",
                       "values": f"1x15 {asked}x30"}]
        checks = [{"eval_time": "10m", "alertname": "SlopilotTargetsDown",
                   "exp_alerts": fired}]
        run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_one_replica_down_of_two_fires_and_both_up_does_not(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard", "prefixHitMin": 0.9})]
    series = [{"series": f"up{labels(instance='a')}", "values": "1x40"},
              {"series": f"up{labels(instance='b')}", "values": "1x15 0x25"}]
    checks = [{"eval_time": "3m", "alertname": "SlopilotTargetsDown", "exp_alerts": []},
              {"eval_time": "7m", "alertname": "SlopilotTargetsDown", "exp_alerts": [DOWN]}]
    run(prometheus_binaries, tmp_path, files, series, checks)


@pytest.mark.prometheus
def test_another_tenants_stall_and_gap_fire_nothing_of_team_a(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", ns,
                        {"profile": "standard", "prefixHitMin": 0.9})
             for ns in ("team-a", "team-b")]
    healthy = [{"series": f"up{labels()}", "values": "1x40"},
               {"series": f"vllm:generation_tokens_total{labels()}", "values": "0+600x40"},
               {"series": f"vllm:num_requests_waiting{labels()}", "values": "4x40"}]
    # team-b stalls and goes down; series that claim team-a's identity without the
    # namespace Prometheus enforces (another tenant's pod or rule wrote them) say so too.
    forged = {"slopilot_namespace": "team-a", "slopilot_deployment": "chat", "instance": "x"}
    forged_sel = "{" + ",".join(f'{k}="{v}"' for k, v in forged.items()) + "}"
    others = [*stall_series("team-b"), {"series": f"up{labels('team-b')}", "values": "0x40"},
              {"series": f"up{forged_sel}", "values": "0x40"},
              {"series": f"vllm:num_requests_waiting{forged_sel}", "values": "400x40"},
              {"series": f"{ABANDONED}{forged_sel[:-1]},priority_class=\"p0\"}}",
               "values": "0+60x40"}]
    b_stalled = {"exp_labels": {"severity": "critical", "action": "hold",
                                "priority_class": "all", **ident("team-b")}}
    checks = []
    for at in ("8m", "10m"):
        checks += [{"eval_time": at, "alertname": "SlopilotTargetsDown",
                    "exp_alerts": [{"exp_labels": {**b_stalled["exp_labels"]}}]},
                   {"eval_time": at, "alertname": "SlopilotEngineStalled",
                    "exp_alerts": [b_stalled]},
                   {"eval_time": at, "alertname": "SlopilotTTFTP99High",
                    "exp_alerts": ttft_alerts("team-b")}]
    run(prometheus_binaries, tmp_path, files, healthy + others, checks)


def stalled_count(at: str, value: float) -> dict[str, Any]:
    sel = ",".join(f'{k}="{v}"' for k, v in ident().items())
    return {"expr": "slopilot:stalled_replicas:count", "eval_time": at,
            "exp_samples": [{"labels": f"slopilot:stalled_replicas:count{{{sel}}}",
                             "value": value}]}


def busy_replica(tokens: str, minutes: int = 30) -> list[dict[str, str]]:
    """One replica with 4 requests running, its token counter ``tokens``, scraped fine."""
    return [{"series": f"vllm:num_requests_running{labels()}", "values": f"4x{minutes}"},
            {"series": f"vllm:generation_tokens_total{labels()}", "values": tokens},
            {"series": f"up{labels()}", "values": f"1x{minutes}"}]


@pytest.mark.prometheus
def test_a_busy_replica_scraped_every_minute_is_not_stalled(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """Prometheus's default scrape interval, 60 s, leaves one sample in the 60 s rate
    window, and no rate: read as no token made, every busy replica counted stalled and
    ``SlopilotEngineStalled`` (hold) fired for good on a healthy deployment (a
    reviewer's real Prometheus). Too few samples to tell is no stall. (promtool's
    windows are closed, so on the minute they hold two samples: the counts between
    are the ones that read 1.)"""
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    times = ("0s", "30s", "1m", "2m30s", "5m", "12m30s", "29m")
    checks = [{"eval_time": at, "alertname": "SlopilotEngineStalled", "exp_alerts": []}
              for at in times]
    run(prometheus_binaries, tmp_path, files, busy_replica("0+6000x30"), checks,
        [stalled_count(at, 0) for at in times], interval="1m")


@pytest.mark.prometheus
def test_a_stall_scraped_every_minute_still_fires(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """At a 60 s scrape the stall is read over 5 minutes where the minute holds one
    sample: tokens stop after 10m, it reads stalled from 14m (promtool's windows are
    closed: on the minute, the minute holds two samples and judges), and the alert
    fires 2 minutes on."""
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    checks = [{"eval_time": at, "alertname": "SlopilotEngineStalled",
               "exp_alerts": [STALLED] if stalled else []}
              for at, stalled in (("12m", False), ("13m30s", False), ("16m", True),
                                  ("25m", True))]
    exprs = [stalled_count("13m30s", 0), stalled_count("14m", 1), stalled_count("25m", 1)]
    run(prometheus_binaries, tmp_path, files, busy_replica("0+6000x10 60000x20"), checks,
        exprs, interval="1m")


@pytest.mark.prometheus
def test_a_stall_at_a_15s_scrape_is_read_over_the_minute_as_before(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """The short window still judges wherever it holds two samples: tokens stop at 5m,
    the minute is flat from 6m, the alert fires at 8m (not 5 minutes later)."""
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    checks = [{"eval_time": at, "alertname": "SlopilotEngineStalled",
               "exp_alerts": [STALLED] if stalled else []}
              for at, stalled in (("5m30s", False), ("7m30s", False), ("8m", True))]
    run(prometheus_binaries, tmp_path, files, busy_replica("0+1500x20 30000x40", 60),
        checks, [stalled_count("5m30s", 0), stalled_count("6m", 1)])


def target_labelled_by_metric_relabel() -> list[dict[str, str]]:
    """A plain Prometheus whose job puts the deployment's labels on with
    ``metric_relabel_configs``: every scraped series has them, ``up`` (target labels
    only) has not."""
    bare = '{namespace="team-a",instance="a",job="engine"}'
    return [{"series": f"vllm:num_requests_running{labels()}", "values": "4x30"},
            {"series": f"vllm:generation_tokens_total{labels()}", "values": "0+1500x30"},
            {"series": f"up{bare}", "values": "1x30"}]


@pytest.mark.prometheus
def test_labels_put_on_by_metric_relabeling_do_not_hold_the_loop_for_good(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    """``up`` without the deployment's labels read as "no target left" while its
    engine's series were scraped every 15 s: ``SlopilotTargetsDown`` (hold) fired for
    good on a healthy deployment (a reviewer's real Prometheus)."""
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    checks: list[dict[str, Any]] = [
        {"eval_time": at, "alertname": "SlopilotTargetsDown", "exp_alerts": []}
        for at in ("3m", "7m")]
    run(prometheus_binaries, tmp_path, files, target_labelled_by_metric_relabel(), checks)


@pytest.mark.prometheus
def test_labels_put_on_by_metric_relabeling_still_fire_once_every_target_is_gone(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    # Every target's scrapes fail from 2m: its series go stale, and none is left.
    files = [rules_file(tmp_path, "llmdeployment-builtin.yaml", "team-a",
                        {"profile": "standard"})]
    series = [{**s, "values": s["values"].replace("x30", "x8 stale")}
              for s in target_labelled_by_metric_relabel()]
    series[-1]["values"] = "1x8 0x22"
    checks: list[dict[str, Any]] = [
        {"eval_time": "1m30s", "alertname": "SlopilotTargetsDown", "exp_alerts": []},
        {"eval_time": "6m", "alertname": "SlopilotTargetsDown", "exp_alerts": [DOWN]}]
    run(prometheus_binaries, tmp_path, files, series, checks)
