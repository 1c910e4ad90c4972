"""The meter container of a vLLM pod: its command line, probes and resources.

A vLLM pod has a second container, the meter (``slopilot meter``): vLLM exports no
per-request SLO verdicts, and the product of its histograms' shares read 81 % of P0's
tokens good on mixed traffic where 13.5 % were (docs/benchmarks.md). The meter takes the
pod's ``http`` port, forwards each request to vLLM on the loopback (vLLM moves to
``VLLM_PORT``), judges each streamed completion as its client sees it, and serves vLLM's
/metrics followed by its verdicts. The Service, the ServiceMonitor and the
NetworkPolicy keep ``http``, so the rules' per-``instance`` join of vLLM's series and the
verdicts holds unchanged. The meter re-reads the ConfigMap's SLO file when it changes:
an SLO edit rolls no vLLM pod, while its command line (the class it judges in) does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slopilot.engine.meter.body_budget import BODY_BUDGET_MIB, MAX_BODY_MIB, METER_MEMORY_MIB
from slopilot.operator.connections_spec import connection_flags
from slopilot.operator.pod_layout import (
    CONFIG_DIR,
    PORT,
    SLO_FILE,
    VLLM_PORT,
    alerts_file_env,
    container_security_context,
)
from slopilot.operator.spec import LLMDeploymentSpec

# The meter's resources. CPU: a request, no limit (but see Guaranteed pods, below). The
# request is its share when the node is busy: the meter spent 117-153 us of CPU a
# streamed chunk, all in (the request's forward and the stream's judging shared over its
# 64 chunks; benchmarks/meter_truth.py), so half a core holds about 3,500 chunks a
# second, a replica streaming over a hundred requests at 30 tokens a second. One process
# takes one core at most (about 7,000). A CFS limit would hold every stream of the
# replica until the next 100 ms period whenever a burst used up the quota: token gaps
# added on the path the meter judges. Memory: about 65 MiB is the interpreter with the
# server stack loaded (slopilot's CLI, fastapi, uvicorn, httpx); the rest holds the
# streams in flight, running or queued in vLLM (a few tens of KiB of buffers each: a
# thousand in some tens of MiB), a copy of vLLM's exposition (hundreds of KiB) at each
# scrape, and the request bodies held until sent on, bounded on the meter's command line
# by the figures derived from this one (``body_budget``: 16 MiB a body, 64 all at once;
# bodies up to 64 MiB, held whole and parsed whole, took it past 580 MB). A limit, equal
# to the request: a proxy that leaks is restarted rather than taking the node's memory
# from vLLM.
# Guaranteed pods: where the engine's CPU and memory requests equal its limits the user
# sized the pod Guaranteed, and one container without a CPU limit makes it Burstable,
# evicted before Guaranteed pods under node pressure: for a GPU pod, its loaded model
# and its GPU lost. There the meter's CPU limit equals its request, and the trade is the
# throttling above: past about 3,500 chunks a second at 500m a burst waits for the next
# CFS period, added to the token gaps the meter judges (``_meter_resources``).
METER_CPU_REQUEST = "500m"
METER_MEMORY = f"{METER_MEMORY_MIB}Mi"


def meter_command(spec: LLMDeploymentSpec) -> list[str]:
    """The meter's command line: every request judged in ``spec.vllm_class``, the class
    the ServiceMonitor relabels vLLM's own series into; its bodies bounded within its
    ``METER_MEMORY`` (written out, so a meter image of another version holds to them)."""
    return ["slopilot", "meter", "--upstream", f"http://127.0.0.1:{VLLM_PORT}",
            "--port", str(PORT), "--slo-file", f"{CONFIG_DIR}/{SLO_FILE}",
            "--priority-class", spec.vllm_class, "--max-body-mb", str(MAX_BODY_MIB),
            "--body-budget-mb", str(BODY_BUDGET_MIB), *connection_flags(spec.connections)]


def _meter_probe(period: int, failures: int) -> dict[str, Any]:
    # A connection only: the meter's /health is vLLM's, proxied, which vLLM's own probes
    # gate already; asked of the meter, it would restart the meter while vLLM loads.
    return {"tcpSocket": {"port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5}


def guaranteed_qos(resources: Mapping[str, Any]) -> bool:
    """Whether a container's resources meet the Guaranteed QoS class's rule: CPU and
    memory limits, each request equal to its limit (an absent request defaults to it)."""
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return all(k in limits and requests.get(k, limits[k]) == limits[k]
               for k in ("cpu", "memory"))


def _meter_resources(guaranteed_pod: bool) -> dict[str, Any]:
    """The meter's share (the constants' comment says why each): a CPU limit only where
    the rest of the pod is Guaranteed, to keep it so."""
    requests = {"cpu": METER_CPU_REQUEST, "memory": METER_MEMORY}
    limits = dict(requests) if guaranteed_pod else {"memory": METER_MEMORY}
    return {"requests": requests, "limits": limits}


def meter_container(spec: LLMDeploymentSpec, image: str,
                    guaranteed_pod: bool) -> dict[str, Any]:
    return {
        "name": "meter", "image": image, "command": meter_command(spec),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": "/tmp"}, alerts_file_env()],
        # The directory, never a subPath: the kubelet updates no subPath mount, and an
        # SLO edit reaches the meter only by the file changing. /tmp is its own, not the
        # pod's: the tenant's vLLM image has no way into the meter's files.
        "volumeMounts": [{"name": "meter-tmp", "mountPath": "/tmp"},
                         {"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True}],
        "readinessProbe": _meter_probe(5, 3), "livenessProbe": _meter_probe(10, 3),
        "resources": _meter_resources(guaranteed_pod),
        "securityContext": container_security_context(),
    }
