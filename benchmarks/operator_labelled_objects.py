"""A tenant's objects made to look like the operator's, and the shared operator's peak
memory: the real ``slopilot operator`` process against the tests' Kubernetes API
emulator (tests/support), its peak resident set (``VmHWM``) sampled every 0.25 s.

``--kind configmaps``: ``--count`` ConfigMaps of ``--size`` bytes in one tenant
namespace, labelled ``app.kubernetes.io/managed-by: slopilot-operator`` (anyone may copy
the label): kopf lists and watches the owned kinds by it. ``--kind replicasets``:
``--crs`` LLMDeployments (tuning off) and, for each, ``--count`` ReplicaSets at
replicas 0 with its selector labels and an annotation of ``--size`` bytes: its pod
syncs list ReplicaSets by those labels (owned_pods.py).

``--one-call``: no operator process; one CR with its Deployment, ``--count``
ReplicaSets (``--kind replicasets``) or bare pods (``--kind pods``) of ``--size`` bytes
with its selector labels that the Deployment does not control, and one ``owned_pods()``
call in this process, its peak traced by ``tracemalloc`` (the emulator's, in this
process too, included) and its time.

The operator is the ``slopilot`` on ``PYTHONPATH`` (the process runs outside any
checkout): set it to the checkout to measure.

    PYTHONPATH=. .venv/bin/python benchmarks/operator_labelled_objects.py \\
        --kind configmaps --count 800 --size 900000

Ends with ``RESULT kind=... count=... size=... crs=... peak_mib=... exit=...`` (with
``--one-call``: ``RESULT kind=... count=... size=... traced_peak_mib=... call_s=...``).
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


def one_call(kube: Kube, kind: str, count: int, size: int) -> tuple[float, float]:
    """The traced peak (MiB) and time (s) of one ``owned_pods()`` beside the junk."""
    import inspect
    import tracemalloc

    from slopilot.operator.owned_meta import owner_reference
    from slopilot.operator.owned_pods import owned_pods

    body = llmd("chat")
    body["metadata"]["namespace"] = TENANT
    cr = kube.create("slopilot.dev/v1alpha1", "llmdeployments", TENANT, body)
    labels = selector("chat")
    template = {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "engine", "image": "x"}]}}
    kube.create("apps/v1", "deployments", TENANT, {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "ownerReferences": [owner_reference(cr)]},
        "spec": {"selector": {"matchLabels": labels}, "template": template}})
    blob = "y" * size
    for i in range(count):
        meta = {"name": f"junk-{i}", "labels": labels, "annotations": {"a": blob}}
        if kind == "pods":
            kube.create("v1", "pods", TENANT, {"apiVersion": "v1", "kind": "Pod",
                                               "metadata": meta, "spec": template["spec"]})
        else:
            kube.create("apps/v1", "replicasets", TENANT, {
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta,
                "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                         "template": template}})
    # main before the bound took no max_replicas
    bound = {"max_replicas": 1} if "max_replicas" in inspect.signature(
        owned_pods).parameters else {}
    tracemalloc.start()
    started = time.monotonic()
    owned_pods(kube, TENANT, "chat", cr["metadata"]["uid"], **bound)
    took = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak, took


def peak_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("configmaps", "replicasets", "pods"),
                        default="configmaps")
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--size", type=int, default=900_000)
    parser.add_argument("--crs", type=int, default=4)
    parser.add_argument("--watch-s", type=float, default=25.0,
                        help="how long the operator runs (default 25)")
    parser.add_argument("--one-call", action="store_true",
                        help="one owned_pods() call, no operator process")
    args = parser.parse_args()
    if args.kind == "pods" and not args.one_call:
        parser.error("--kind pods is measured with --one-call only")
    crs = args.crs if args.kind == "replicasets" else 0
    work = Path(tempfile.mkdtemp(prefix="labelled-objects"))
    with serve_emulator(work) as kube:
        kube.install(crd_manifest(), *yaml.safe_load_all(PEERING.read_text()))
        api = Kube(kube.api_client())
        for ns in (TENANT, "slopilot-system"):
            api.create("v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": ns}})
        if args.one_call:
            peak_traced, took = one_call(api, args.kind, args.count, args.size)
            print(f"RESULT kind={args.kind} count={args.count} size={args.size} "
                  f"traced_peak_mib={peak_traced:.0f} call_s={took:.1f}")
            return
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
                # Not run from a checkout: ``-m`` puts the working directory first on
                # the path, ahead of PYTHONPATH's.
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
            peak = 0
            try:
                end = time.monotonic() + args.watch_s
                while time.monotonic() < end and proc.poll() is None:
                    time.sleep(0.25)
                    peak = max(peak, peak_mib(proc.pid))
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:  # busy past its grace: the peak stands
                    proc.kill()
                    proc.wait()
    print(f"RESULT kind={args.kind} count={args.count} size={args.size} crs={crs} "
          f"peak_mib={peak} exit={proc.returncode}")


if __name__ == "__main__":
    main()
