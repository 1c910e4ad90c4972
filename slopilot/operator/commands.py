"""``slopilot operator``: run the kopf operator with slopilot's handlers.

Light at import (argparse only): kopf, the client and the tuner load when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import random
import signal
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slopilot.operator.kubeapi import ApiError, Kube
    from slopilot.operator.peer_registry import Registration
    from slopilot.operator.peer_strip import PeerStrip
    from slopilot.operator.peering import Ensured
    from slopilot.operator.served_patterns import ServedPatterns

# The peering object of manifests/kopf-peering.yaml (kept here so --help needs no kopf).
PEERING_NAME = "slopilot"
# kopf pauses every peer that sees a live peer of higher OR EQUAL priority, so replicas
# at one fixed priority would all freeze. Each process draws its own from a range this
# wide: two replicas collide with probability 1/(2**31-1), and even then kopf only
# pauses both (and warns) until one restarts: it never lets both act.
PRIORITY_MIN, PRIORITY_MAX = 1, 2**31 - 1
_RNG: random.Random = random.SystemRandom()  # tests swap in a seeded Random

log = logging.getLogger(__name__)


def draw_priority() -> int:
    return _RNG.randint(PRIORITY_MIN, PRIORITY_MAX)


def priority(text: str) -> int:
    """argparse type: an integer, as kopf compares them (negative ones are allowed)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--priority {text!r} is not an integer; give e.g. --priority 100, or leave it "
            "out for a random one") from None


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
    # Drawn here, when the command line is built at start-up, so that the parsed
    # arguments hold the value this process runs with (and logs).
    p.add_argument("--priority", type=priority, default=draw_priority(), metavar="N",
                   help="peering priority: the live peer with the highest one acts, the "
                        "others wait. Default: random in "
                        f"{PRIORITY_MIN}..{PRIORITY_MAX}, drawn per process, so that "
                        "replicas of one Deployment (almost surely) differ; with equal "
                        "priorities kopf pauses them all. A run that must win (debugging) "
                        f"takes one above the range: --priority {PRIORITY_MAX + 1}. "
                        "Ignored with --standalone")
    p.add_argument("--liveness", type=_liveness_url, metavar="URL",
                   help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz (a "
                        "port of its own: kopf serves port 0 on 80, so 0 is refused)")
    p.add_argument("--metrics", type=_metrics_address, metavar="HOST:PORT",
                   help="serve the controllers' series (trials, actions, replicas, the "
                        "twin's check) for Prometheus, e.g. --metrics 0.0.0.0:8081")
    p.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    p.add_argument("action", nargs="?", choices=("run", "uninstall"), default="run",
                   help="run (the default): serve the LLMDeployments. uninstall: delete "
                        "every LLMDeployment in the namespaces given, wait --timeout for a "
                        "running operator to end each, then end the rest here (their "
                        "studies deleted where this process's SLOPILOT_ALLOWED_STORAGE "
                        "reaches them, the operator's finalizer released), so that none "
                        "stays Terminating; then delete the operator and the CRD. It asks "
                        "the API server first and changes nothing where you may not do "
                        "all of it (bind the ClusterRole slopilot-uninstaller)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="uninstall: how long a running operator is given to end the "
                        "CRs (default 120; 0 when no operator runs)")
    p.set_defaults(func=run)


def _liveness_url(text: str) -> str:
    """argparse type: kopf serves ``http://HOST:0/...`` on port 80 (``port or 80``), not
    on a free port as a listener's 0 means: another process's there stopped the operator
    before it reconciled anything."""
    try:
        port = urllib.parse.urlsplit(text).port
    except ValueError:
        port = None
    if port == 0:
        raise argparse.ArgumentTypeError(
            f"--liveness {text!r}: port 0 is served on port 80 by kopf, not on a free "
            "port; give the port, e.g. --liveness http://0.0.0.0:8080/healthz")
    return text


def _metrics_address(text: str) -> tuple[str, int]:
    from slopilot.operator.metrics_endpoint import metrics_address

    return metrics_address(text)


def run(args: argparse.Namespace) -> int:
    import kopf

    import slopilot.operator.handlers  # noqa: F401  # registers the handlers
    from slopilot.operator.settings import peering_lifetime_s, started_policy

    if not args.all_namespaces and not args.namespace:
        # A usage error: exit 2, as argparse's are (SystemExit(message) exits 1).
        print("slopilot operator: say where to work: --all-namespaces or --namespace NS "
              "(repeatable)", file=sys.stderr)
        raise SystemExit(2)
    if args.action == "uninstall":
        return run_uninstall(args)
    from slopilot.operator.daemon import check_daemon_settings

    try:  # fail here, not in kopf's startup handler (which retries)
        lifetime = peering_lifetime_s()
        started_policy()
        check_daemon_settings()
    except ValueError as exc:
        raise SystemExit(f"slopilot operator: {exc}") from None
    from slopilot.operator.kubeapi import Kube, KubeConfigError, load_client

    try:  # permanent: kopf's login would retry it every minute, a traceback each time
        kube = Kube(load_client())
    except KubeConfigError as exc:
        raise SystemExit(f"slopilot operator: {exc}") from None
    kopf.configure(verbose=args.verbose)
    if args.metrics is not None:
        from slopilot.operator.metrics_endpoint import serve_metrics

        try:
            serve_metrics(args.metrics)
        except OSError as exc:
            raise SystemExit(f"slopilot operator: --metrics {args.metrics[0]}:"
                             f"{args.metrics[1]}: cannot listen there ({exc})") from None
        log.info("slopilot operator: controller series at %s:%d/metrics", *args.metrics)
    stop = _stop_event()
    with _signals_stop(stop):
        from kopf._core.engines.peering import detect_own_id

        from slopilot.operator.peering import is_glob, terminating_namespaces
        from slopilot.operator.peering_keeper import STOP_WITHIN_S
        from slopilot.operator.served_patterns import ServedPatterns
        from slopilot.operator.study_reclaim import serving

        reached = _reach_api(kube, args, stop)
        if reached is None:
            return 0  # stopped while it waited
        closed = dict(reached.closed)
        if not args.standalone and any(is_glob(ns) for ns in args.namespace or []):
            closed |= terminating_namespaces(kube, serving(
                [ns for ns in args.namespace if is_glob(ns)]))
        # Each namespace closed at the start is left out until it is gone, then served
        # again: served without its KopfPeering it would pause every other one.
        namespaces = ServedPatterns(args.namespace or [], closed)
        if args.standalone:
            log.info("slopilot operator: standalone (no peering)")
        else:
            log.info("slopilot operator: peering %r at priority %d (lifetime %d s)",
                     args.peering, args.priority, lifetime)
        identity = detect_own_id(manual=False)
        registration = None
        if not args.standalone and not args.all_namespaces:
            registration = _register_peer(kube, args, identity, lifetime, namespaces, stop)
        keeper = (_keep_peerings(kube, args.peering, namespaces, stop,
                                 registration.strip if registration else None)
                  if not args.standalone and not args.all_namespaces else None)
        threading.Thread(target=_reclaim,
                         args=(None if args.all_namespaces else args.namespace,),
                         name="study-reclaim", daemon=True).start()
        try:
            return _run_until_signalled(lambda stop: kopf.run(
                clusterwide=args.all_namespaces, namespaces=namespaces,
                standalone=args.standalone or None,
                peering_name=None if args.standalone else args.peering,
                priority=None if args.standalone else args.priority,
                identity=identity,
                liveness_endpoint=args.liveness, stop_flag=stop), stop)
        finally:
            stop.set()  # kopf may have ended on its own: the keeper ends with it
            if keeper is not None:
                keeper.join(STOP_WITHIN_S)
            if registration is not None:  # after kopf: its last touch removed its entries
                registration.renewals.join(STOP_WITHIN_S)  # a renewal in flight ends first:
                registration.lease.withdraw()  # its 404 would make the Lease again


def _stop_event() -> threading.Event:
    """What SIGTERM / SIGINT set (a test hands in one already set)."""
    return threading.Event()


def _reach_api(kube: Kube, args: argparse.Namespace,
               stop: threading.Event) -> Ensured | None:
    """Wait for the API server to answer, then make the peering objects (unless
    standalone); None where a stop came first. An API server that does not answer may
    be starting: waited for, one line a try. A namespace gone or being deleted is
    skipped (``closed``); any other refused peering object is permanent: the command
    stops."""
    from slopilot.operator.api_reach import NotReady, not_ready, server_of, until_reachable
    from slopilot.operator.kubeapi import ApiError
    from slopilot.operator.peering import Ensured, ensure_peering

    def step() -> Ensured:
        try:
            kube.request("GET", "/version")
        except ApiError as exc:  # an answer, a refusal too, is a server there; but a 5xx
            if not_ready(exc):  # (a load balancer's 503 page) is one not ready yet
                raise NotReady(exc) from None
        if not args.standalone:
            try:
                return ensure_peering(kube, args.peering, namespaces=args.namespace)
            except ApiError as exc:
                if not_ready(exc):
                    raise NotReady(exc) from None
                raise SystemExit(f"slopilot operator: cannot create the peering object "
                                 f"{args.peering!r}: {exc}; {_peering_fix(exc)}") from None
        return Ensured()

    return until_reachable(step, server=server_of(kube), wait=stop.wait,
                           warn=lambda line: log.warning("slopilot operator: %s", line))


def _peering_fix(exc: ApiError) -> str:
    """What the administrator does about a refused peering object."""
    if exc.status == 403:
        return ("grant the operator's account the ClusterRole slopilot-operator in that "
                "namespace (a RoleBinding, docs/operations.md), or run --standalone")
    return "apply manifests/kopf-peering.yaml (its CRDs) first"


@dataclasses.dataclass(frozen=True)
class _Registered:
    """This replica's peer registration, the thread renewing it, and its judge."""

    lease: Registration
    renewals: threading.Thread
    strip: PeerStrip


def _register_peer(kube: Kube, args: argparse.Namespace, identity: str, lifetime: int,
                   patterns: ServedPatterns, stop: threading.Event
                   ) -> _Registered | None:
    """This replica registered as a peer in the operator's namespace (renewed beside
    kopf until ``stop``), and the judge that strips the served namespaces' KopfPeerings
    of the peers no replica registered (peer_registry.py, peer_strip.py); None where no
    operator namespace is known or the registration is refused (warned of: the forged
    peers a tenant may write are then left in place)."""
    from slopilot.operator.kubeapi import ApiError
    from slopilot.operator.peer_registry import (
        ROLE,
        Registration,
        known_operator_namespace,
    )
    from slopilot.operator.peer_strip import PeerStrip

    home = known_operator_namespace()
    if home is None:
        log.warning("slopilot operator: no operator namespace known (no "
                    "$SLOPILOT_OPERATOR_NAMESPACE, no service account): this run registers "
                    "as a peer nowhere and strips no forged peers from the KopfPeerings; "
                    "the in-cluster replicas remove its peer entries (so do not count on "
                    "them pausing for it: scale them to 0, or set "
                    "$SLOPILOT_OPERATOR_NAMESPACE to their namespace where this login may "
                    "write leases)")
        return None
    registration = Registration(kube, home, args.peering, identity, args.priority, lifetime)
    try:
        registration.register()
    except ApiError as exc:
        log.warning("slopilot operator: cannot register as a peer in namespace %s (%s): "
                    "forged peers in the served namespaces' KopfPeerings are not removed, "
                    "and other replicas remove this one's entries; bind the Role %s "
                    "(manifests/rbac.yaml) to the operator's account there", home, exc, ROLE)
        return None
    renewals = threading.Thread(target=registration.keep, args=(stop,),
                                name="peer-registration", daemon=True)
    renewals.start()
    log.info("slopilot operator: registered as peer %r in namespace %s", identity, home)
    return _Registered(registration, renewals, PeerStrip(
        kube, args.peering, home, lifetime, (identity, args.priority), patterns.served,
        stop=stop))


def _keep_peerings(kube: Kube, name: str, patterns: ServedPatterns,
                   stop: threading.Event, strip: PeerStrip | None = None
                   ) -> threading.Thread:
    """A KopfPeering in each namespace kopf starts serving while it runs (a glob's, one
    created again, one left out at the start and created again), stripped of forged
    peers by ``strip``: peering_keeper.py, beside kopf, until ``stop``."""
    from slopilot.operator.peering_keeper import keep_peerings

    keeper = threading.Thread(target=keep_peerings, args=(kube, name, patterns.served, stop),
                              kwargs={"left_out": patterns,
                                      "judge": strip.judge if strip else None},
                              name="peering-keeper", daemon=True)
    keeper.start()
    return keeper


def _reclaim(namespaces: list[str] | None) -> None:
    """The studies of CRs gone without the operator, deleted at its start
    (study_reclaim.py); beside kopf, which does not wait for it."""
    from slopilot.operator.api_reach import Unreachable, why_unreachable
    from slopilot.operator.kubeapi import Kube, load_client
    from slopilot.operator.settings import operator_policy
    from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving

    try:
        done = reclaim_orphaned_studies(Kube(load_client()), operator_policy(),
                                        serving(namespaces))
    except Unreachable as exc:  # gone again since the start: kopf waits for it
        log.warning("slopilot operator: orphaned studies not reclaimed: the API server did "
                    "not answer (%s); the next start tries again", why_unreachable(exc))
        return
    except Exception:  # a leak kept until the next start, never a reason not to run
        log.exception("slopilot operator: orphaned studies not reclaimed")
        return
    log.info("slopilot operator: %d orphaned studies reclaimed, %d storages or record "
             "entries skipped (each logged above), %d record entries dropped",
             len(done.deleted), len(done.skipped), len(done.forgotten))


def run_uninstall(args: argparse.Namespace) -> int:
    """``slopilot operator uninstall``: 0 once every LLMDeployment in scope is deleted and
    holds no finalizer of the operator's; 1 where the caller may not do all of it
    (nothing changed), or where a CR could not be deleted or released (each named, with
    what was left: the command run again finishes the job)."""
    from slopilot.operator.api_reach import Unreachable, server_of, unreachable_message
    from slopilot.operator.kubeapi import Kube, KubeConfigError, load_client
    from slopilot.operator.settings import operator_policy
    from slopilot.operator.uninstall import UninstallRefused, uninstall

    if args.timeout < 0:
        raise SystemExit(f"slopilot operator uninstall: --timeout {args.timeout} is "
                         "negative; give the seconds to wait, 0 for none")
    try:
        policy = operator_policy()
    except ValueError as exc:
        raise SystemExit(f"slopilot operator uninstall: {exc}") from None
    try:
        kube = Kube(load_client())
    except KubeConfigError as exc:
        raise SystemExit(f"slopilot operator uninstall: {exc}") from None
    try:
        done = uninstall(kube, policy,
                         namespaces=None if args.all_namespaces else args.namespace,
                         timeout_s=args.timeout)
    except UninstallRefused as exc:
        print(exc, file=sys.stderr)
        return 1
    except Unreachable as exc:  # a person runs this: say so, rather than wait for it
        raise SystemExit(f"slopilot operator uninstall: "
                         f"{unreachable_message(server_of(kube), exc)}; check that the "
                         "cluster is up and the kubeconfig's server is right, then run "
                         "the command again (it goes on from where it stopped)") from None
    for key in done.ended_by_operator:
        print(f"{key}: ended by the operator")
    for key in done.released:
        print(f"{key}: ended here (no operator ended it in {args.timeout:g} s)")
    for line in done.studies_left:
        print(f"study left (the operator's next start reclaims it): {line}")
    for line in (*done.not_deleted, *done.stuck):
        print(line, file=sys.stderr)
    return 1 if done.stuck or done.not_deleted else 0


@contextlib.contextmanager
def _signals_stop(stop: threading.Event) -> Iterator[None]:
    """SIGTERM / SIGINT set ``stop`` (and ``OPERATOR_STOPPING``) while in the block, from
    the wait for the API server to kopf's end; the handlers before it are put back."""
    from slopilot.operator.tuning_daemon import OPERATOR_STOPPING

    def on_signal(signum: int, _frame: object) -> None:
        log.info("slopilot operator: %s received, stopping", signal.Signals(signum).name)
        OPERATOR_STOPPING.set()
        stop.set()

    before = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run_until_signalled(run_kopf: Callable[[threading.Event], None],
                         stop: threading.Event) -> int:
    """Run kopf on a worker thread; ``stop`` (set by SIGTERM / SIGINT, ``_signals_stop``)
    stops it.

    kopf handles signals itself only on the main thread, and then tells running daemons
    to stop; but a daemon it (re)starts while shutting down (an event from the last
    status write) never hears it, and the pod hangs until its grace period ends. Taking
    the signal here first raises ``OPERATOR_STOPPING``, which every controller daemon
    checks, then kopf's stop flag.
    """
    failure: list[BaseException] = []

    def work() -> None:
        try:
            run_kopf(stop)
        except BaseException as exc:  # reported by the main thread, which exits non-zero
            failure.append(exc)

    worker = threading.Thread(target=work, name="kopf")
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    if failure:
        log.error("slopilot operator: kopf failed: %r", failure[0])
        return 1
    return 0
