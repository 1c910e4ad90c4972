"""A tenant's objects made to look like the operator's, and the shared operator's peak
memory: the real ``slopilot operator`` process against the tests' Kubernetes API
emulator (tests/support), its peak resident set (``VmHWM``) sampled every 0.25 s.

``--kind configmaps``: ``--count`` ConfigMaps of ``--size`` bytes in one tenant
namespace, labelled ``app.kubernetes.io/managed-by: slopilot-operator`` (anyone may copy
the label): kopf lists and watches the owned kinds by it. ``--kind replicasets``:
``--crs`` LLMDeployments (tuning off) and, for each, ``--count`` ReplicaSets at
replicas 0 with its selector labels and an annotation of ``--size`` bytes: its pod
syncs list ReplicaSets by those labels (owned_pods.py).

The operator is whatever ``slopilot`` the interpreter imports: run it with
``PYTHONPATH`` at another checkout to measure that one.

    .venv/bin/python benchmarks/operator_labelled_objects.py --kind configmaps \\
        --count 800 --size 900000

Ends with ``RESULT kind=... count=... size=... crs=... peak_mib=... exit=...``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

# The tests' emulator, after PYTHONPATH: the checkout measured comes first.
sys.path.append(str(Path(__file__).resolve().parents[1]))

from slopilot.operator.crd import crd_manifest
from slopilot.operator.kubeapi import Kube
from slopilot.operator.owned_meta import MANAGED, selector
from tests.operator.operator_support import llmd
from tests.support.kube_server import serve_emulator

PEERING = Path(__file__).resolve().parents[1] / "manifests" / "kopf-peering.yaml"
TENANT = "team-a"


def fill(kube: Kube, kind: str, count: int, size: int, crs: int) -> None:
    blob = "x" * size
    if kind == "configmaps":
        for i in range(count):
            kube.create("v1", "configmaps", TENANT, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"junk-{i}", "labels": dict(MANAGED)},
                "data": {"k": blob}})
        return
    for c in range(crs):
        name = f"c{c}"
        body = llmd(name, tuning={"enabled": False})
        body["metadata"]["namespace"] = TENANT
        kube.create("slopilot.dev/v1alpha1", "llmdeployments", TENANT, body)
        labels = selector(name)
        for i in range(count):
            kube.create("apps/v1", "replicasets", TENANT, {
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": f"{name}-junk-{i}", "labels": labels,
                             "annotations": {"a": blob}},
                "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "containers": [{"name": "c", "image": "x"}]}}}})


def peak_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("configmaps", "replicasets"), default="configmaps")
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--size", type=int, default=900_000)
    parser.add_argument("--crs", type=int, default=4)
    parser.add_argument("--watch-s", type=float, default=25.0,
                        help="how long the operator runs (default 25)")
    args = parser.parse_args()
    crs = args.crs if args.kind == "replicasets" else 0
    work = Path(tempfile.mkdtemp(prefix="labelled-objects"))
    with serve_emulator(work) as kube:
        kube.install(crd_manifest(), *yaml.safe_load_all(PEERING.read_text()))
        api = Kube(kube.api_client())
        for ns in (TENANT, "slopilot-system"):
            api.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns}})
        started = time.monotonic()
        fill(api, args.kind, args.count, args.size, crs)
        print(f"made {args.count * max(crs, 1)} {args.kind} of {args.size} B in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.pop("SLOPILOT_CONTROLLER_FACTORY", None)
        with open(work / "operator.log", "w+") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "slopilot.cli", "operator", "--all-namespaces",
                 "--peering=slopilot", "--liveness=http://127.0.0.1:0/healthz"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
            peak = 0
            try:
                end = time.monotonic() + args.watch_s
                while time.monotonic() < end and proc.poll() is None:
                    time.sleep(0.25)
                    peak = max(peak, peak_mib(proc.pid))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(f"RESULT kind={args.kind} count={args.count} size={args.size} crs={crs} "
          f"peak_mib={peak} exit={proc.returncode}")


if __name__ == "__main__":
    main()
