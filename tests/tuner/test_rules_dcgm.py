"""Whose GPUs a deployment's utilization reads: the DCGM exporter's series only, and only
the deployment's own GPUs.

The utilization feeds ``SlopilotBatchingUnderused`` (action retune: live trials on the
deployment), so a series another tenant can write must not reach it. Team-a's engine
pods run team-a's image and are scraped by the operator's ServiceMonitor, without
honorLabels: their ``namespace`` and ``pod`` are the scrape's (team-a's), and whatever
the image says there lands in ``exported_namespace``/``exported_pod``. So the exporter's
series are read where they name the GPU's pod in ``namespace``/``pod`` (the exporter
scraped with honorLabels, as its chart does), or in ``exported_*`` only under the
exporter's own ``namespace``, which the administrator names (``dcgm_namespace``; the
operator's ``$SLOPILOT_DCGM_NAMESPACE``). Each case runs the rendered rules in promtool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.engine.slo import SLOSpec
from slopilot.tuner.prometheus.rules import RuleError, render_rule_groups, render_rules_yaml
from tests.support.fixtures import prometheus_binaries  # noqa: F401 - a fixture
from tests.support.prometheus import PrometheusBinaries, promtool

B_POD = "chat-7d9f-abcde"
DCGM_NAMESPACE = "gpu-operator"
BUSY = 1.0
"""Team-b's own engine is busy all the time: no batching problem at all, so any
utilization under 0.6 the rules read came from somewhere else."""

FORGED = {
    # Team-a's own engine pod, scraped by the operator's ServiceMonitor (the target's
    # labels are team-a's): only the exported labels its image wrote name team-b's pod.
    "exported labels from another tenant's pod": (
        'slopilot_namespace="team-a",slopilot_deployment="evil",namespace="team-a",'
        'pod="evil-1",job="evil",exported_namespace="team-b",exported_pod="' + B_POD + '"'),
    # An engine's series with its own namespace and pod labels honoured (a scrape job of
    # the administrator's with honor_labels), in either of the exporter's shapes: the
    # operator's identity labels on it say an engine wrote it, never the exporter.
    "an engine's series, its labels honoured": (
        'slopilot_namespace="team-a",slopilot_deployment="evil",'
        f'namespace="team-b",pod="{B_POD}"'),
    "an engine's series in the exporter's namespace, its labels honoured": (
        'slopilot_namespace="team-a",slopilot_deployment="evil",'
        f'namespace="{DCGM_NAMESPACE}",pod="dcgm-exporter-5x7kq",'
        f'exported_namespace="team-b",exported_pod="{B_POD}"'),
}

GENUINE = {
    # The exporter's chart default: honorLabels, so namespace/pod are the GPU's pod.
    "honor": (f'namespace="team-b",pod="{B_POD}",gpu="0",job="dcgm-exporter",'
              'instance="10.0.0.9:9400"', 0.2),
    # Without honorLabels: namespace/pod are the exporter's own, exported_* the GPU's.
    "exported": (f'namespace="{DCGM_NAMESPACE}",pod="dcgm-exporter-5x7kq",gpu="0",'
                 f'exported_namespace="team-b",exported_pod="{B_POD}",'
                 'job="dcgm-exporter",instance="10.0.0.9:9400"', 0.3),
}


def _engine(namespace_label: str | None) -> list[dict[str, str]]:
    """Team-b's one engine pod, as the operator's ServiceMonitor scrapes it: 150 requests
    waiting, so the batching alert fires as soon as the utilization reads under 0.6."""
    labels = (f'slopilot_namespace="team-b",slopilot_deployment="chat",namespace="team-b",'
              f'pod="{B_POD}",job="chat"')
    assert namespace_label in (None, "namespace")  # the scrape's namespace is that label
    return [{"series": f"vllm:num_requests_running{{{labels}}}", "values": "10x20"},
            {"series": f"vllm:num_requests_waiting{{{labels}}}", "values": "150x20"},
            {"series": f"slopilot_busy_ratio{{{labels}}}", "values": f"{BUSY}x20"}]


def _read(binaries: PrometheusBinaries, tmp_path: Path, *, namespace_label: str | None,
          dcgm_namespace: str | None, gpus: list[str], utilization: float,
          gpu: float | None) -> None:
    """Team-b's ``chat`` rules with ``gpus`` (DCGM_FI_DEV_GPU_UTIL label sets at 1 %, or
    at the percent each names) beside its engine: at 5 minutes the recorded GPU
    utilization is ``gpu`` (None: no sample), the alert's figure ``utilization``, and the
    batching alert fires exactly where that is under 0.6."""
    (tmp_path / "rules.yaml").write_text(render_rules_yaml(
        SLOSpec.from_dict({"profile": "standard"}), "chat", namespace="team-b",
        namespace_label=namespace_label, dcgm_namespace=dcgm_namespace))
    ident = {"slopilot_namespace": "team-b", "slopilot_deployment": "chat"}
    if namespace_label:
        ident[namespace_label] = "team-b"
    sel = ",".join(f'{k}="{v}"' for k, v in sorted(ident.items()))
    series = [{"series": f"DCGM_FI_DEV_GPU_UTIL{{{g}}}", "values": f"{pct}x20"}
              for g, pct in (_percent(g) for g in gpus)]
    test: dict[str, Any] = {"interval": "30s", "input_series": _engine(namespace_label) + series,
                            "promql_expr_test": [
        {"expr": f"slopilot:utilization:ratio{{{sel}}}", "eval_time": "5m",
         "exp_samples": [{"labels": f"slopilot:utilization:ratio{{{sel}}}",
                          "value": utilization}]},
        {"expr": f"slopilot:gpu_utilization:avg{{{sel}}}", "eval_time": "5m",
         "exp_samples": [] if gpu is None else [
             {"labels": f"slopilot:gpu_utilization:avg{{{sel}}}", "value": gpu}]},
        {"expr": f'ALERTS{{alertname="SlopilotBatchingUnderused",alertstate="firing",{sel}}}',
         "eval_time": "5m", "exp_samples": [] if utilization >= 0.6 else [
             {"labels": 'ALERTS{alertname="SlopilotBatchingUnderused",alertstate="firing",'
                        f'severity="warning",action="retune",priority_class="all",{sel}}}',
              "value": 1}]},
    ]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": [test]}))
    result = promtool(binaries, "test", "rules", "t.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _percent(labels: str) -> tuple[str, float]:
    for value, pct in GENUINE.values():
        if labels == value:
            return labels, pct * 100
    return labels, 1.0


@pytest.mark.prometheus
@pytest.mark.parametrize("dcgm_namespace", [None, DCGM_NAMESPACE])
@pytest.mark.parametrize("namespace_label", [None, "namespace"])
@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
def test_another_tenants_series_change_nothing(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        forged: str, namespace_label: str | None, dcgm_namespace: str | None) -> None:
    # The reviewer's case: team-a's series at 1 % named team-b's pod, team-b's
    # utilization read 0.01 and its batching alert (retune) fired.
    _read(prometheus_binaries, tmp_path, namespace_label=namespace_label,
          dcgm_namespace=dcgm_namespace, gpus=[forged], utilization=BUSY, gpu=None)


@pytest.mark.prometheus
@pytest.mark.parametrize("namespace_label", [None, "namespace"])
@pytest.mark.parametrize("mode", GENUINE.keys())
def test_the_exporters_series_give_the_deployment_its_gpu_utilization(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        mode: str, namespace_label: str | None) -> None:
    # Every forged series beside the genuine one: the figure is the genuine GPU's alone.
    labels, ratio = GENUINE[mode]
    _read(prometheus_binaries, tmp_path, namespace_label=namespace_label,
          dcgm_namespace=DCGM_NAMESPACE, gpus=[labels, *FORGED.values()],
          utilization=ratio, gpu=ratio)


@pytest.mark.prometheus
@pytest.mark.parametrize("namespace_label", [None, "namespace"])
def test_without_the_exporters_namespace_its_exported_labels_are_not_read(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path,  # noqa: F811
        namespace_label: str | None) -> None:
    # Unset, nothing says which namespace's ``exported_*`` to believe: the busy ratio.
    _read(prometheus_binaries, tmp_path, namespace_label=namespace_label,
          dcgm_namespace=None, gpus=[GENUINE["exported"][0]], utilization=BUSY, gpu=None)


@pytest.mark.prometheus
def test_both_shapes_together_average_every_gpu_of_the_deployment(
        prometheus_binaries: PrometheusBinaries, tmp_path: Path) -> None:  # noqa: F811
    _read(prometheus_binaries, tmp_path, namespace_label="namespace",
          dcgm_namespace=DCGM_NAMESPACE, gpus=[g for g, _ in GENUINE.values()],
          utilization=0.25, gpu=0.25)


def test_the_gpu_selectors_name_the_namespaces() -> None:
    spec = SLOSpec.from_profile("standard")

    def gpu_expr(**kwargs: Any) -> str:
        rules = render_rule_groups(spec, "chat", **kwargs)["groups"][0]["rules"]
        return str(next(r["expr"] for r in rules
                        if r.get("record") == "slopilot:gpu_utilization:avg"))

    honor = gpu_expr(namespace="team-b")
    assert 'DCGM_FI_DEV_GPU_UTIL{namespace="team-b",' in honor
    assert "exported_namespace" not in honor and "label_replace" not in honor
    # Where the Prometheus enforces a label of its own, the series must carry it too.
    assert ('DCGM_FI_DEV_GPU_UTIL{namespace="team-b",tenant="team-b",'
            'slopilot_namespace="",slopilot_deployment=""}'
            in gpu_expr(namespace="team-b", namespace_label="tenant"))
    both = gpu_expr(namespace="team-b", dcgm_namespace=DCGM_NAMESPACE)
    assert (f'namespace="{DCGM_NAMESPACE}",exported_namespace="team-b"' in both
            and "label_replace" in both)
    # Deterministic where nothing is configured: the rules file is compared byte for byte.
    assert gpu_expr(namespace="team-b") == honor
    with pytest.raises(RuleError, match="dcgm_namespace"):
        render_rule_groups(spec, "chat", namespace="team-b", dcgm_namespace="")
