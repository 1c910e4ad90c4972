"""``$SLOPILOT_DCGM_NAMESPACE``: where the DCGM exporter runs, so the rules may read its
series scraped without honorLabels; and the ServiceMonitor the honorLabels mode relies on.

A deployment's utilization counts the exporter's series that name its pods
(tests/tuner/test_rules_dcgm.py runs the rules). In the honorLabels mode a series counts
where its ``namespace`` is the deployment's: that is safe only while no tenant's pod can
carry another namespace there, which the operator's own ServiceMonitor guarantees by
leaving the scraped labels to lose to the target's (honorLabels false).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slopilot.operator.policy import OperatorPolicy, PolicyError
from slopilot.operator.reconcile import RULES_FILE, desired_objects
from slopilot.operator.render import render_all
from slopilot.operator.settings import operator_policy
from slopilot.operator.spec import parse_spec

GPU_RECORD = "slopilot:gpu_utilization:avg"


def body(backend: str = "builtin") -> dict[str, Any]:
    return {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": "chat", "namespace": "team-b", "uid": "uid-b"},
            "spec": {"model": {"name": "smollm2-135m"}, "backend": backend}}


def test_the_exporters_namespace_is_read_from_the_environment() -> None:
    assert operator_policy({}).dcgm_namespace is None
    assert operator_policy({"SLOPILOT_DCGM_NAMESPACE": ""}).dcgm_namespace is None
    assert operator_policy({"SLOPILOT_DCGM_NAMESPACE": " gpu-operator "}).dcgm_namespace \
        == "gpu-operator"


@pytest.mark.parametrize("value", ["GPU-Operator", "gpu_operator", "-gpu", "gpu-", "a" * 64,
                                   "gpu operator", "kube-system/dcgm"])
def test_a_bad_exporters_namespace_names_the_variable_value_and_fix(value: str) -> None:
    with pytest.raises(PolicyError) as err:
        operator_policy({"SLOPILOT_DCGM_NAMESPACE": value})
    message = str(err.value)
    assert f"SLOPILOT_DCGM_NAMESPACE={value!r}" in message
    assert "DNS label" in message and "unset it" in message
    # Said once, not blamed on the other variables.
    assert "SLOPILOT_ALLOWED_IMAGES" not in message
    with pytest.raises(PolicyError, match="SLOPILOT_DCGM_NAMESPACE"):
        OperatorPolicy(dcgm_namespace=value)


@pytest.mark.parametrize("backend", ["builtin", "vllm"])
def test_the_operators_service_monitor_lets_no_pod_name_its_namespace_or_pod(
        backend: str) -> None:
    # honorLabels unset is false: a pod's own namespace/pod labels become exported_*,
    # and nothing the endpoint relabels writes either, so a tenant's engine cannot pass
    # its series off as the exporter's for another namespace's GPU.
    b = body(backend)
    for endpoint in render_all(b, parse_spec(b)).service_monitor["spec"]["endpoints"]:
        assert endpoint.get("honorLabels", False) is False
        written = {r.get("targetLabel") for r in endpoint.get("relabelings", [])
                   + endpoint.get("metricRelabelings", [])}
        assert not written & {"namespace", "pod"}
        assert all(r.get("action") not in ("labelmap", "labeldrop", "labelkeep")
                   for r in endpoint.get("metricRelabelings", []))


def _gpu_expr(b: dict[str, Any], *, monitoring: bool, dcgm_namespace: str | None) -> str:
    objects = desired_objects(b, parse_spec(b), replicas=1, monitoring=monitoring,
                              operator_namespace="slopilot-system",
                              dcgm_namespace=dcgm_namespace)
    if monitoring:
        groups = next(o for o in objects if o["kind"] == "PrometheusRule")["spec"]
    else:
        cm = next(o for o in objects if o["metadata"]["name"].endswith("-rules"))
        groups = yaml.safe_load(cm["data"][RULES_FILE])
    return str(next(r["expr"] for r in groups["groups"][0]["rules"]
                    if r.get("record") == GPU_RECORD))


@pytest.mark.parametrize("monitoring", [True, False])
def test_the_exporters_namespace_reaches_the_deployments_rules(monitoring: bool) -> None:
    b = body()
    unset = _gpu_expr(b, monitoring=monitoring, dcgm_namespace=None)
    assert "exported_namespace" not in unset
    assert unset == _gpu_expr(b, monitoring=monitoring, dcgm_namespace=None)
    named = _gpu_expr(b, monitoring=monitoring, dcgm_namespace="gpu-operator")
    assert 'namespace="gpu-operator",exported_namespace="team-b"' in named
