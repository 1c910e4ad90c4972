"""The Grafana overview dashboard, generated with grafana_foundation_sdk.

``python -m slopilot.operator.dashboards`` rewrites dashboards/slopilot-overview.json
and, for vLLM deployments, dashboards/slopilot-overview-vllm.json (its latency panels
read the meter's client-side histograms, as the loop does there, with vLLM's own P99
beside them); a test checks the checked-in files equal the generated ones. Queries use
the engine's series (vLLM names, so a vLLM backend fills most panels too), the recording
rules of
``slopilot.tuner.prometheus.rules`` for goodput, and the tuner/kube series listed in
``EXTERNAL_METRICS``. Every series is selected by ``slopilot_namespace`` and
``slopilot_deployment``, the labels the scrape configuration puts on each engine pod's
series (a deployment is its namespace and name: ``chat`` in two namespaces is two), and
by the Prometheus's enforced namespace label (``ENFORCED_LABEL``), which no tenant can
write: the chosen namespace, or the operator's (``$operator_namespace``) for the
operator's own series, or none (a Prometheus that stamps nothing).

The SLO lines are the chosen deployment's own: each is a query of the target its rules
record (``tuner/prometheus/objectives``), drawn dashed, so one dashboard serves a strict
and a relaxed deployment alike, and an objective a deployment does not have draws no
line. The vLLM dashboard leaves out what only the built-in engine exports (its decode
stalls, garbage-collector pauses, live knobs, swapped requests, 429s and send deadlines).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, prometheus, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from slopilot.engine.latency_buckets import DENSE_FROM_S, DENSE_TO_S, QUANTILE_STEP
from slopilot.engine.meter.client_latency import CLIENT_ABANDONED
from slopilot.engine.meter.exposition import METER_REFUSED
from slopilot.engine.metric_names import (
    ABANDONED,
    CONNECTIONS_REFUSED,
    REFUSED,
    RETRIES,
    SEND_TIMEOUTS,
)
from slopilot.engine.request import Priority
from slopilot.engine.verdicts import SLO_REQUESTS
from slopilot.tuner.prometheus.latency_sources import LatencySource
from slopilot.tuner.prometheus.objectives import (
    PREEMPTIONS_SLO,
    PREFIX_HIT_SLO,
    TBT_P99_SLO,
    TTFT_P99_SLO,
    UTILIZATION_FLOOR,
)
from slopilot.tuner.prometheus.rules import (
    BUILTIN_LATENCY,
    DEPLOYMENT_LABEL,
    NAMESPACE_LABEL,
    REPLICA_LABEL,
    LatencySources,
    RuleError,
    check_namespace_label,
    latency_quantile,
)

UID = "slopilot-overview"
VLLM_UID = "slopilot-overview-vllm"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
ENFORCED_LABEL = "namespace"
"""The label the Prometheus stamps with the namespace of the monitor or rule a series came
from, which no tenant can write (prometheus-operator's ``enforcedNamespaceLabel``, the
operator's ``SLOPILOT_NAMESPACE_LABEL``; both default to it in ``manifests/``); another is
``build_dashboard(namespace_label=...)``, ``--namespace-label``."""
OPERATOR_NAMESPACE = "slopilot-system"
"""The default of the ``$operator_namespace`` variable: the manifests' namespace."""
_TENANT_GUARD = f'{ENFORCED_LABEL}=~"$namespace|"'
_OPERATOR_GUARD = f'{ENFORCED_LABEL}=~"$operator_namespace|"'
# The slopilot_* labels alone are a tenant's to write: their own ServiceMonitor,
# PodMonitor or rule in team-evil can put slopilot_namespace="team-b" on a series. The
# enforced label (team-evil there) must say the chosen namespace too, or be absent (a
# Prometheus without the enforcement: it guards nothing there, and draws as before; under
# it, no tenant's series lacks the label). Exact for one namespace chosen: with several,
# a tenant among them can draw under another chosen one's name.
SEL = (f'{NAMESPACE_LABEL}=~"$namespace",{DEPLOYMENT_LABEL}=~"$deployment",'
       f"{_TENANT_GUARD}")
OP_SEL = (f'{NAMESPACE_LABEL}=~"$namespace",{DEPLOYMENT_LABEL}=~"$deployment",'
          f"{_OPERATOR_GUARD}")
"""The operator's own series (tuner, replicas, twin), scraped from its pod: the enforced
label is the operator's namespace, never a tenant's."""
RATE = "$__rate_interval"
WHOSE = f"{{{{{NAMESPACE_LABEL}}}}}/{{{{{DEPLOYMENT_LABEL}}}}}"
"""A legend's deployment: several may be chosen at once."""
IDENT = f"{NAMESPACE_LABEL}, {DEPLOYMENT_LABEL}"
"""What every aggregation keeps: with several namespaces chosen, ``chat`` in team-a and
in team-b are two lines, not one sum (a review's finding on the panels that summed)."""


def _by(*labels: str) -> str:
    """``by (labels..., namespace and deployment)``."""
    return f"by ({', '.join((*labels, IDENT))})"

# Series the dashboard or the rules read that the engine does not export: the tuner and
# operator export the slopilot_* ones (name, labels), kube-state-metrics and Prometheus
# the rest.
EXTERNAL_METRICS: dict[str, str] = {
    "slopilot_tuner_trials_total":
        "counter{slopilot_namespace, slopilot_deployment, "
        "state=complete|pruned|failed|reverted}: tuner trials by outcome",
    "slopilot_tuner_actions_total":
        "counter{slopilot_namespace, slopilot_deployment, "
        "action=hold|retune|trial|repeat|commit|revert|cooldown|scale|inform, reason=a "
        "word of tuner/loop/reasons.py or other}: controller actions",
    "slopilot_replicas": "gauge{slopilot_namespace, slopilot_deployment}: replicas the "
                         "operator asked for",
    "slopilot_twin_error": "gauge{slopilot_namespace, slopilot_deployment, quantity, "
                           "priority_class}: the last twin check's relative errors",
    "slopilot_twin_trusted": "gauge{slopilot_namespace, slopilot_deployment}: 1 while the "
                             "controller trusts its twin",
    "slopilot_twin_correction_factor": "gauge{slopilot_namespace, slopilot_deployment, "
                                       "feature}: what the twin's live correction learned",
    "kube_deployment_status_replicas": "gauge{namespace, deployment}: kube-state-metrics",
    "DCGM_FI_DEV_GPU_UTIL": "gauge{namespace, pod, gpu} in percent: NVIDIA's DCGM exporter "
                            "(the batching alert's GPU utilization)",
    "ALERTS": "Prometheus' own series of pending and firing alerts",
    "up": "Prometheus' own series, one per scrape target: 1 where its last scrape "
          "succeeded (the targets-down alert reads it)",
}

KNOBS_GRAPHED = ("token_budget", "chunk_size", "max_num_seqs", "recompute_max_tokens",
                 "max_preemptions_per_step", "swap_timeout_ms")


def _query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def _line(series: str, what: str, priority_class: str | None = None) -> prometheus.Dataquery:
    """The target the chosen deployment's rules record in ``series`` (``objectives``;
    no sample, so no line, where it has no such objective): a line per deployment
    chosen, named for it, as the variables take several."""
    cls = "" if priority_class is None else f',priority_class="{priority_class}"'
    return _query(f"max by ({NAMESPACE_LABEL}, {DEPLOYMENT_LABEL}) ({series}{{{SEL}{cls}}})",
                  f"{what} {{{{{NAMESPACE_LABEL}}}}}/{{{{{DEPLOYMENT_LABEL}}}}}")


# A line, not a series: dashed, red, unfilled (a threshold drawn from a query).
_LINE_STYLE = [
    DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
    DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}),
    DynamicConfigValue("custom.fillOpacity", 0),
    DynamicConfigValue("custom.lineWidth", 2),
]


def _series(title: str, queries: list[prometheus.Dataquery], *, unit: str,
            line: prometheus.Dataquery | None = None, width: int = 8, height: int = 8,
            description: str = "") -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).datasource(DATASOURCE).unit(unit)
             .span(width).height(height).fill_opacity(10)
             .legend(common_b.VizLegendOptions().show_legend(True)
                     .display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM)))
    if description:
        panel = panel.description(description)
    targets = queries if line is None else [*queries, line]
    for i, q in enumerate(targets):
        panel = panel.with_target(q.ref_id(chr(ord("A") + i)))
    if line is not None:
        # Styled by its query, whatever its legend (a deployment's name) reads.
        panel = panel.override_by_query(chr(ord("A") + len(queries)), _LINE_STYLE)
    return panel


def _latency_panels(latency: LatencySources) -> list[timeseries.Panel]:
    panels = []
    for short, source, target in (("TTFT", latency.ttft, TTFT_P99_SLO),
                                  ("TBT", latency.tbt, TBT_P99_SLO)):
        for p in Priority:
            sel = f'{{{SEL},priority_class="{p.label}"}}'
            # As the loop reads them, the figures its rules record: a request turned away
            # for load is a first token never given (rules.bucket_rates); on vLLM, the
            # meter's client-side figure where it saw a stream, else vLLM's; each
            # replica read at every threshold of the deployment's SLO (rules.judged_rates),
            # which a dashboard shared by every deployment cannot know: read here over
            # the raw buckets, a fleet of replicas started with and before an SLO edit
            # summed one's edge at 800 ms with nothing, and first tokens all at 795 ms
            # read 859 ms.
            who = f"{{{{{NAMESPACE_LABEL}}}}}/{{{{{DEPLOYMENT_LABEL}}}}}"
            queries = [_query(f"max by ({NAMESPACE_LABEL}, {DEPLOYMENT_LABEL}) "
                              f"(slopilot:{short.lower()}_seconds:{tag.lower()}{sel})",
                              f"{tag} {who}")
                       for tag in ("P99", "P50")]
            description = (f"P99 and P50 as the deployment's rules record them, over "
                           f"their rate window: within {QUANTILE_STEP:.0%} of the exact "
                           f"figures from {DENSE_FROM_S * 1000:g} ms to {DENSE_TO_S:g} s "
                           "(a bucket's width). Where the SLO line is an edge of a "
                           "replica's histograms (every profile's is; a custom SLO's on "
                           "the built-in engine and the meter where their process started "
                           "with it), over it or not is exact; a replica started before "
                           "an edit of the SLO is read as if its bucket that holds the "
                           "line lay under it, and claims no breach its buckets cannot "
                           "prove.")
            if source.client is not None:
                # vLLM's own beside it: the gap is what its frontend adds (parsing,
                # detokenizing, the write), which vLLM's histograms leave out.
                queries.append(_query(latency_quantile(
                    0.99, LatencySource(source.engine), sel, RATE, by=f"le, {IDENT}"),
                    f"P99 as vLLM measures it {who}"))
                description = (
                    "P99 and P50 as the loop reads them: the meter's, as the clients saw "
                    "each stream (from the request's arrival at the meter to each write), "
                    f"within {QUANTILE_STEP:.0%} of the exact figures from "
                    f"{DENSE_FROM_S * 1000:g} ms to {DENSE_TO_S:g} s; or vLLM's own where "
                    "the meter saw no stream. vLLM measures from the start of tokenizing "
                    "to its engine's output, and reads low, on its own coarser buckets: "
                    "a gap between 10 and 25 ms, say, is only known to be there.")
            if short == "TTFT":
                # vLLM's own histogram, read where the meter saw no first token, ends at
                # 2,560 s: a stall there reads that edge, not the meter's 300 s.
                if source.client is None:
                    edge, top = "300 s, the histograms' last finite edge", "300 s"
                    wait = "a five-minute wait"
                else:
                    edge = ("the last finite edge of the histogram read: 300 s on the "
                            "meter's, 2,560 s on vLLM's own (where the meter saw no first "
                            "token in the window)")
                    top, wait = "either edge", "a wait that long"
                description += (
                    " A request turned away for load (429, the built-in engine), refused "
                    "at the connection cap (503, by its header's class) or whose "
                    "client left before a first token after waiting past the target counts "
                    f"as a first token never given: read as {edge}. So a P99 of {top} "
                    f"says at least 1 % (a P50 of {top}, at least 50 %) of the class's "
                    f"requests were refused or left past the target, not {wait}; "
                    "a client that left within the target missed nothing and is not "
                    "counted.")
            description += (f" Dashed: the deployment's own {short} P99 target for "
                            f"{p.label.upper()} (its rules record it as {target}); no "
                            "line, no target (best effort).")
            panels.append(_series(f"{short} {p.label.upper()}", queries, unit="s",
                                  line=_line(target, "P99 SLO", p.label),
                                  description=description))
    return panels


def _throughput_panels(vllm: bool) -> list[Any]:
    requests = [_query(f"sum {_by()} (vllm:num_requests_running{{{SEL}}})", f"running {WHOSE}"),
                _query(f"sum {_by()} (vllm:num_requests_waiting{{{SEL}}})", f"waiting {WHOSE}")]
    finished = [_query(f"sum {_by('finished_reason')} (rate(vllm:request_success_total"
                       f"{{{SEL}}}[{RATE}]))", f"{{{{finished_reason}}}} {WHOSE}")]
    finished_about = (
        "By vLLM's finished_reason (stop, length, abort, ...). Streams cut before a first "
        "token: the meter's count of streams whose client went away before one reached "
        "it (a stall's queue: vLLM queues and answers no 429); the TTFT panels count each "
        "whose client had waited past its TTFT target as a first token never given.")
    if vllm:
        finished.append(_query(
            f"sum {_by('priority_class')} (rate({CLIENT_ABANDONED}{{{SEL}}}[{RATE}]))",
            f"streams cut before a first token {{{{priority_class}}}} {WHOSE}"))
        finished.append(_query(
            f"sum {_by('priority_class')} (rate({METER_REFUSED}{{{SEL}}}[{RATE}]))",
            f"refused at the meter's cap {{{{priority_class}}}} {WHOSE}"))
        finished_about += (
            " Refused at the meter's cap: requests for generation the meter answered 503 "
            "at its connection cap, in its class; the TTFT panels count each as a first "
            "token never given.")
    else:  # the built-in engine's own series: vLLM has none of them
        requests.append(_query(f"sum {_by()} (slopilot_num_requests_swapped{{{SEL}}})",
                               f"swapped {WHOSE}"))
        finished += [
            _query(f"sum {_by('priority_class')} (rate({REFUSED}{{{SEL}}}[{RATE}]))",
                   f"turned away (429, or 503 at the cap) {{{{priority_class}}}} {WHOSE}"),
            _query(f"sum {_by('priority_class')} (rate({ABANDONED}{{{SEL}}}[{RATE}]))",
                   f"left before a first token {{{{priority_class}}}} {WHOSE}"),
            _query(f"sum {_by('priority_class')} (rate({RETRIES}"
                   f"{{{SEL},outcome=\"refused\"}}[{RATE}]))",
                   f"retries turned away {{{{priority_class}}}} {WHOSE}"),
            _query(f"sum {_by()} (rate({SEND_TIMEOUTS}{{{SEL}}}[{RATE}]))",
                   f"cut at the send deadline {WHOSE}")]
        finished_about = (
            "Turned away: requests the engine refused for load (its waiting queue full), "
            "and requests for generation refused at the connection cap, by the class "
            "their header names, never served; the TTFT panels count each as a first "
            "token never given. "
            "Left before a first token: requests whose client went away (or whose answer "
            "failed) before one reached it, a stall's queue; those that had waited past "
            "the TTFT target are counted as first tokens never given too. Retries "
            "turned away: a client's later tries of a call "
            "(x-stainless-retry-count above 0) turned away, counted apart from the calls. "
            "Cut at the send deadline: streams whose client took no byte for "
            "--send-timeout, aborted in the engine (also in the abort reason).")
    # Both servers cap their connections (the meter in front of vLLM): 503s, never load.
    finished.append(_query(f"sum {_by()} (rate({CONNECTIONS_REFUSED}{{{SEL}}}[{RATE}]))",
                           f"refused at the connection cap (503) {WHOSE}"))
    finished_about += (" Refused at the connection cap: requests answered 503 because "
                       "--max-connections connections held every slot (slow readers, "
                       "idle keep-alive clients, or more clients than the pod holds), of "
                       "every path, in no class; those for generation are in their "
                       "class's refusals too.")
    return [
        _series("Tokens per second and goodput", [
            _query(f"sum {_by()} (rate(vllm:generation_tokens_total{{{SEL}}}[{RATE}]))",
                   f"generated {WHOSE}"),
            _query(f"sum {_by()} (rate(vllm:prompt_tokens_total{{{SEL}}}[{RATE}]))",
                   f"prompt {WHOSE}"),
            _query(f"sum {_by('priority_class')} "
                   f"(slopilot:goodput_tokens:per_second{{{SEL}}})",
                   f"goodput {{{{priority_class}}}} {WHOSE}")],
            unit="short", description="Goodput: output tokens of requests inside their "
            "class's SLO (recording rule slopilot:goodput_tokens:per_second)."),
        _series("Requests within their SLO", [
            _query(f"(sum {_by('priority_class')} (rate({SLO_REQUESTS}"
                   f"{{{SEL},met=\"true\"}}[{RATE}])) / sum {_by('priority_class')} "
                   f"(rate({SLO_REQUESTS}{{{SEL}}}[{RATE}]))) and on (priority_class, "
                   f"{IDENT}) count {_by('priority_class')} "
                   f"({TTFT_P99_SLO}{{{SEL}}} or {TBT_P99_SLO}{{{SEL}}})",
                   f"{{{{priority_class}}}} {WHOSE}")],
            unit="percentunit", description="The share of the requests the engine judged "
            "that were within their class's SLO: TTFT within target and at most 1 % of "
            "their token gaps over the TBT target. Judged: those that finished, those "
            "turned away for load (429, a miss with no token) and those cut short after "
            "they had missed already (no first token within the target); one cut short "
            "that could still have met it is not judged. The built-in engine's verdicts; "
            "on vLLM, the meter's, of streamed requests. Only the classes with a latency "
            "objective are drawn: a best-effort class (no TTFT or TBT target) has none "
            "to meet."),
        _series("Requests", requests, unit="short"),
        _series("Finished requests per second", finished, unit="reqps",
                description=finished_about),
    ]


def _scheduler_panels(vllm: bool) -> list[Any]:
    batch = (heatmap.Panel().title("Batch size (tokens per iteration)").datasource(DATASOURCE)
             .span(8).height(8).calculate(False)
             .with_target(_query(f"sum by (le) (increase(vllm:iteration_tokens_total_bucket"
                                 f"{{{SEL}}}[{RATE}]))", "{{le}}")
                          .format(PromQueryFormat.HEATMAP)))
    every = _query(f"sum {_by()} (rate(vllm:num_preemptions_total{{{SEL}}}[{RATE}])) * 60",
                   f"{'preemptions' if vllm else 'all'} {WHOSE}")
    limit = _line(PREEMPTIONS_SLO, "limit")
    limit_about = ("Dashed: the deployment's limit (its SLO's maxPreemptionsPerMinute); "
                   "no line, no limit.")
    alert_input = _query(f"slopilot:utilization:ratio{{{SEL}}}", f"alert input {WHOSE}")
    gpu = _query(f"slopilot:gpu_utilization:avg{{{SEL}}}", f"GPU (DCGM) {WHOSE}")
    floor = ("Dashed: the batching alert's floor (spec.alerts.utilizationMin): it fires "
             "while the alert input stays under it and more requests wait than "
             "spec.alerts.waitingMin.")
    if vllm:
        return [
            _series("Preemptions per minute", [every], unit="short", line=limit,
                    description=limit_about),
            batch,
            _kv_cache_panel(),
            _prefix_panel(),
            # The alert input is DCGM's figure here (vLLM exports no busy ratio): one
            # line, not the same one twice.
            _series("GPU utilization (the batching alert's input)",
                    [alert_input.legend_format(f"GPU (DCGM), the alert input {WHOSE}")],
                    unit="percentunit", line=_line(UTILIZATION_FLOOR, "alert floor"),
                    description="DCGM's GPU utilization of the deployment's pods, the "
                    "alert input (vLLM exports no busy ratio to stand in for it: no DCGM "
                    f"exporter, no figure). {floor}"),
        ]
    return [
        _series("Preemptions per minute by mode", [
            _query(f"sum {_by('mode')} (rate(slopilot_preemptions_total{{{SEL}}}[{RATE}]))"
                   " * 60", f"{{{{mode}}}} {WHOSE}"), every],
            unit="short", line=limit, description=limit_about),
        batch,
        _series("Longest decode stall (last minute)", [
            _query(f"max {_by('priority_class')} (slopilot_decode_stall_max_seconds{{{SEL}}})",
                   f"{{{{priority_class}}}} {WHOSE}")], unit="s"),
        _series("Garbage-collector pause p99 (every thread waits it out)", [
            _query(f"histogram_quantile(0.99, sum {_by('le', 'generation')} (rate("
                   f"slopilot_gc_pause_seconds_bucket{{{SEL}}}[{RATE}])))",
                   f"generation {{{{generation}}}} {WHOSE}")], unit="s"),
        _kv_cache_panel(),
        _prefix_panel(),
        _series("Busy ratio and GPU utilization (the batching alert's input)", [
            alert_input, gpu, _query(f"slopilot_busy_ratio{{{SEL}}}",
                                     f"busy {WHOSE} {{{{{REPLICA_LABEL}}}}}")],
            unit="percentunit", line=_line(UTILIZATION_FLOOR, "alert floor"),
            description="The alert input: DCGM's GPU utilization of the deployment's pods "
            f"where it reports them, else the engines' busy ratio. {floor}"),
    ]


def _kv_cache_panel() -> timeseries.Panel:
    return _series("KV cache usage", [
        _query(f"vllm:kv_cache_usage_perc{{{SEL}}}", f"{WHOSE} {{{{{REPLICA_LABEL}}}}}")],
        unit="percentunit")


def _prefix_panel() -> timeseries.Panel:
    return _series("Prefix cache hit rate", [
        _query(f"sum {_by()} (rate(vllm:prefix_cache_hits_total{{{SEL}}}[{RATE}])) / "
               f"sum {_by()} (rate(vllm:prefix_cache_queries_total{{{SEL}}}[{RATE}]))",
               f"hit rate {WHOSE}")],
        unit="percentunit", line=_line(PREFIX_HIT_SLO, "expected minimum"),
        description="Dashed: the least hit ratio the deployment expects (its SLO's "
        "prefixHitMin); no line, none expected.")


def _tuning_panels(vllm: bool) -> list[Any]:
    panels: list[Any] = []
    if not vllm:  # the built-in engine's live configuration: vLLM exports none
        knobs = "|".join(KNOBS_GRAPHED)
        panels += [
            _series("Knobs over time", [
                _query(f'max {_by("knob")} (slopilot_config_knob{{{SEL},knob=~"{knobs}"}})',
                       f"{{{{knob}}}} {WHOSE}")], unit="short", width=12),
            statetimeline.Panel().title("Live configuration").datasource(DATASOURCE)
            .span(12).height(8)
            .with_target(_query(
                f"count {_by('token_budget', 'chunk_size', 'max_num_seqs', 'preemption_mode')} "
                f"(slopilot_config_info{{{SEL}}})",
                f"{WHOSE} budget {{{{token_budget}}}} chunk {{{{chunk_size}}}} seqs "
                "{{max_num_seqs}} {{preemption_mode}}"))]
    return [
        *panels,
        _series("Replicas", [
            _query(f"max {_by()} (slopilot_replicas{{{OP_SEL}}})", f"desired {WHOSE}"),
            _query('sum by (namespace, deployment) (kube_deployment_status_replicas{'
                   'namespace=~"$namespace",deployment=~"$deployment"})',
                   "kube {{namespace}}/{{deployment}}"),
            # Pods, by the gauge both backends export from the start: vLLM has no
            # slopilot_engine_info, and one series per data-parallel engine.
            _query(f"count {_by()} (count {_by(REPLICA_LABEL)} "
                   f"(vllm:num_requests_running{{{SEL}}}))", f"scraped engines {WHOSE}")],
            unit="short", width=12),
        _series("Tuner trials and actions", [
            _query(f"sum {_by('state')} (increase(slopilot_tuner_trials_total{{{OP_SEL}}}"
                   f"[{RATE}]))", f"trials {{{{state}}}} {WHOSE}"),
            _query(f"sum {_by('action')} (increase(slopilot_tuner_actions_total{{{OP_SEL}}}"
                   f"[{RATE}]))", f"action {{{{action}}}} {WHOSE}")], unit="short", width=12),
    ]


def _twin_panels() -> list[Any]:
    return [
        _series("Twin error and trust", [
            _query(f'max {_by("quantity")} (slopilot_twin_error'
                   f'{{{OP_SEL},quantity=~"step_time.*"}})', f"{{{{quantity}}}} {WHOSE}"),
            _query(f'max {_by("quantity")} (slopilot_twin_error'
                   f'{{{OP_SEL},priority_class="p0"}})', f"P0 {{{{quantity}}}} {WHOSE}"),
            _query(f"min {_by()} (slopilot_twin_trusted{{{OP_SEL}}})",
                   f"trusted (100% = yes) {WHOSE}")],
            unit="percentunit", width=12, description="The controller's last check of its "
            "twin against a measured window: (predicted - measured) / measured step time, "
            "as calibrated and after the live correction, and the P0 p99s; trusted is 1 "
            "while warm starts and capacity plans come from the twin (docs/twin.md)."),
        _series("What the twin's correction learned", [
            _query(f"max {_by('feature')} (slopilot_twin_correction_factor{{{OP_SEL}}})",
                   f"{{{{feature}}}} {WHOSE}")],
            unit="short", width=12, description="Per cost-model feature, the factor the "
            "live correction put on the calibrated profile's coefficient (1: as "
            "calibrated; no line: the twin runs uncorrected). A correction learned on a "
            "quiet window is carried into every load the twin is asked about, a busy one "
            "too (docs/twin.md, Limits)."),
    ]


def _annotation(name: str, expr: str, color: str) -> dash.AnnotationQuery:
    return (dash.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True)
            .icon_color(color).expr(expr))


# Fields the Prometheus annotation reads that the SDK's AnnotationQuery lacks.
_ANNOTATION_EXTRAS = {
    "Tuner actions": {"titleFormat": "{{action}}", "tagKeys": "action,reason", "step": "30s"},
    "Tuner trials": {"titleFormat": "trial {{state}}", "tagKeys": "state", "step": "30s"},
    "Alerts": {"titleFormat": "{{alertname}}", "tagKeys": "action,priority_class,severity",
               "step": "30s"},
}


def build_dashboard(*, latency: LatencySources = BUILTIN_LATENCY,
                    namespace_label: str = ENFORCED_LABEL) -> dict[str, Any]:
    """The overview dashboard as a JSON-ready dict: TTFT and TBT from ``latency`` (the
    backend's, ``service_monitor.latency_sources``), the SLO lines from the chosen
    deployment's recorded objectives, every series matched on ``namespace_label`` (the
    Prometheus's enforced namespace label) as well."""
    try:
        check_namespace_label(namespace_label)
    except RuleError as e:
        raise ValueError(f"namespace_label={namespace_label!r}: {e}") from None
    vllm = latency != BUILTIN_LATENCY
    builder = (
        dash.Dashboard("slopilot overview (vLLM)" if vllm else "slopilot overview")
        .uid(VLLM_UID if vllm else UID).tags(["slopilot", "llm", "slo"])
        .description("LLM serving against its SLO: latency per class, throughput, "
                     "scheduler, and what the tuner changed.")
        .refresh("30s").time("now-1h", "now").tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus")
                       .type("prometheus"))
        .with_variable(dash.QueryVariable("namespace").label("Namespace")
                       .datasource(DATASOURCE)
                       .query(f"label_values(vllm:num_requests_running, {NAMESPACE_LABEL})")
                       .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                       # All is the namespaces listed, not ".*": that made the guard
                       # (namespace=~"$namespace|") match every namespace, and Grafana
                       # opens a multi-value variable on All.
                       .multi(True).include_all(True))
        .with_variable(dash.QueryVariable("deployment").label("Deployment")
                       .datasource(DATASOURCE)
                       .query(f'label_values(vllm:num_requests_running{{{NAMESPACE_LABEL}'
                              f'=~"$namespace",{_TENANT_GUARD}}}, {DEPLOYMENT_LABEL})')
                       .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                       .multi(True).include_all(True).all_value(".*"))
        # Typed, not listed from the series: a list would offer any namespace a tenant's
        # monitor names, and the operator's is the administrator's to know.
        .with_variable(dash.TextBoxVariable("operator_namespace").label("Operator namespace")
                       .description("The namespace the slopilot operator runs in: the "
                                    "Tuning and Twin rows read its series only from "
                                    "there.")
                       .default_value(OPERATOR_NAMESPACE))
        .annotation(_annotation(
            "Tuner actions",
            f"changes(slopilot_tuner_actions_total{{{OP_SEL}}}[1m]) > 0", "orange"))
        .annotation(_annotation(
            "Tuner trials", f"changes(slopilot_tuner_trials_total{{{OP_SEL}}}[1m]) > 0", "blue"))
        .annotation(_annotation(
            "Alerts", f'ALERTS{{alertstate="firing",{SEL}}}', "red")))
    sections: list[tuple[str, list[Any]]] = [
        ("Latency per class", _latency_panels(latency)),
        ("Throughput", _throughput_panels(vllm)),
        ("Scheduler", _scheduler_panels(vllm)),
        ("Tuning", _tuning_panels(vllm)),
        ("Twin", _twin_panels()),
    ]
    for title, panels in sections:
        builder = builder.with_row(dash.Row(title))
        for panel in panels:
            builder = builder.with_panel(panel)
    data: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for ann in data["annotations"]["list"]:
        ann.update(_ANNOTATION_EXTRAS.get(ann["name"], {}))
    if namespace_label != ENFORCED_LABEL:
        data = _renamed(data, {g: g.replace(ENFORCED_LABEL, namespace_label, 1)
                               for g in (_TENANT_GUARD, _OPERATOR_GUARD)})
    return data


def _renamed(node: Any, guards: dict[str, str]) -> Any:
    """``node`` with each guard matcher (only those: ``namespace`` is kube-state-metrics'
    own label too) written for another enforced label."""
    if isinstance(node, str):
        for old, new in guards.items():
            node = node.replace(old, new)
        return node
    if isinstance(node, dict):
        return {k: _renamed(v, guards) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, guards) for v in node]
    return node


def render_dashboard(*, latency: LatencySources = BUILTIN_LATENCY,
                     namespace_label: str = ENFORCED_LABEL) -> str:
    return json.dumps(build_dashboard(latency=latency, namespace_label=namespace_label),
                      indent=2, sort_keys=True) + "\n"


def dashboard_path() -> Path:
    return Path(__file__).resolve().parents[2] / "dashboards" / "slopilot-overview.json"


def vllm_dashboard_path() -> Path:
    return dashboard_path().with_name("slopilot-overview-vllm.json")


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate both checked-in dashboards; the arguments are parsed first, so
    ``--help`` or a wrong one writes nothing."""
    parser = argparse.ArgumentParser(
        prog="python -m slopilot.operator.dashboards",
        description=f"Write the Grafana dashboards {dashboard_path().name} (built-in "
        f"engine) and {vllm_dashboard_path().name} (vLLM) under "
        f"{dashboard_path().parent}, rendered from the alert table.")
    parser.add_argument("--namespace-label", default=ENFORCED_LABEL,
                        help="the Prometheus's enforcedNamespaceLabel (the operator's "
                        "SLOPILOT_NAMESPACE_LABEL), which every query matches as well "
                        f"(default: {ENFORCED_LABEL}, the checked-in files')")
    args = parser.parse_args(argv)
    try:
        check_namespace_label(args.namespace_label)
    except RuleError as e:
        parser.error(f"--namespace-label {args.namespace_label!r}: {e}")
    from slopilot.tuner.prometheus.rules import VLLM_LATENCY

    for path, latency in ((dashboard_path(), BUILTIN_LATENCY),
                          (vllm_dashboard_path(), VLLM_LATENCY)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_dashboard(latency=latency,
                                         namespace_label=args.namespace_label))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
