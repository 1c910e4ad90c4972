"""The engine pod's ports and the files it mounts, and what each container runs as.

The containers declare them, and the Service, the NetworkPolicy, the ConfigMap and the
command lines name the same: a port or a path renamed in one place only is a pod that
no Service reaches or an engine that reads no config.
"""

from __future__ import annotations

from typing import Any

from slopilot.engine.alert_factors import ALERTS_FILE_ENV

PORT = 8000
# The built-in engine's /admin/* endpoints listen here, apart from inference, so that the
# NetworkPolicy can let only the operator reach them (`slopilot serve --admin-port`).
ADMIN_PORT = 8081
ADMIN_PORT_NAME = "admin"
# vLLM listens here behind its meter, which takes PORT. On every interface, not the
# loopback alone: the kubelet probes vLLM on the pod's IP. The NetworkPolicy names no rule
# for it, so other pods reach vLLM only through the meter.
VLLM_PORT = 8001
VLLM_PORT_NAME = "vllm"
SCRAPE_INTERVAL_S = 15
"""How often the ServiceMonitor has Prometheus scrape each pod's /metrics: a trial's window
must span a few of these for every replica's rates to read its requests."""
CONFIG_DIR = "/etc/slopilot"
CONFIG_FILE = "engine.json"
SLO_FILE = "slo.json"
ALERTS_FILE = "alerts.json"
"""Beside ``SLO_FILE``: ``spec.alerts``' factors, whose thresholds the pods make edges."""
CLIENTS_FILE = "clients.json"


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}


def alerts_file_env() -> dict[str, str]:
    """What tells ``slopilot serve`` and ``slopilot meter`` where ``ALERTS_FILE`` is: a
    variable, not a flag, so an image from before it starts as before (ignoring it)."""
    return {"name": ALERTS_FILE_ENV, "value": f"{CONFIG_DIR}/{ALERTS_FILE}"}
