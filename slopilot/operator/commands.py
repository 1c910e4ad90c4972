"""``slopilot operator``: run the kopf operator with slopilot's handlers.

Light at import (argparse only): kopf, the client and the tuner load when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

# The peering object of manifests/kopf-peering.yaml (kept here so --help needs no kopf).
PEERING_NAME = "slopilot"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator (kopf) for LLMDeployments",
        description="Reconcile LLMDeployments (slopilot.dev/v1alpha1) and run one tuner "
                    "controller per deployment. Credentials: in-cluster service account, "
                    "else $KUBECONFIG or ~/.kube/config.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="serve every namespace (needs the ClusterRole)")
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="serve this namespace (repeatable; a glob such as team-* works)")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument("--peering", default=PEERING_NAME, metavar="NAME",
                         help="kopf peering object to join, so that only one operator "
                              f"replica acts (default: {PEERING_NAME})")
    peering.add_argument("--standalone", action="store_true",
                         help="no peering: for a single replica or local runs")
    p.add_argument("--liveness", metavar="URL",
                   help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    import slopilot.operator.handlers  # noqa: F401  # registers the handlers

    if not args.all_namespaces and not args.namespace:
        raise SystemExit("slopilot operator: say where to work: --all-namespaces or "
                         "--namespace NS (repeatable)")
    kopf.configure(verbose=args.verbose)
    kopf.run(clusterwide=args.all_namespaces, namespaces=args.namespace,
             standalone=args.standalone or None,
             peering_name=None if args.standalone else args.peering,
             liveness_endpoint=args.liveness)
    return 0
