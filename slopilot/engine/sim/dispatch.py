"""Which replica an arrival goes to: the load balancer in front of the twin's replicas.

The operator puts the replicas behind a ClusterIP Service (``operator/render.py``).
kube-proxy in its iptables and nftables modes picks a ready backend at random for each
connection, knowing nothing of its load; in IPVS mode it defaults to round robin, as the
demo's load generator sends (``tuner/local/loadgen.py``). A twin that always picks the
replica with the fewest unfinished requests smooths every burst over the fleet and sizes
it optimistically (by up to two replicas), so the default is what the Service does:
``random``. ``least_requests`` is what a load-aware router (an Envoy or a gateway's
least-request policy) does, for a deployment that has one.

``random`` draws from a stream of its own, seeded from the run's seed: the workload a
seed draws is the same whatever the policy, so two policies compare on the very requests.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from enum import StrEnum

from slopilot.engine.sim.spec_reader import did_you_mean
from slopilot.engine.sim.workload import child_rng


class Dispatch(StrEnum):
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    LEAST_REQUESTS = "least_requests"


DEFAULT_DISPATCH = Dispatch.RANDOM
"""kube-proxy's default modes (iptables, nftables): what the operator's Service does."""
DISPATCH_CHOICES: tuple[str, ...] = tuple(d.value for d in Dispatch)
_DISPATCH_STREAM = 101
"""``child_rng``'s purpose key for the dispatcher: no workload uses it (open_loop's are 1-3,
sessions' 11-13, trace's 21-24), so its draws never shift a request's."""


def parse_dispatch(value: object) -> Dispatch:
    """``value`` as a policy; ValueError saying what it is not and the choices (the
    caller names the field or the flag, with the value)."""
    if isinstance(value, str) and value in DISPATCH_CHOICES:
        return Dispatch(value)
    hint = did_you_mean(value, DISPATCH_CHOICES) if isinstance(value, str) else ""
    raise ValueError(f"unknown dispatch policy; {hint}use one of: "
                     f"{', '.join(DISPATCH_CHOICES)}")


class Dispatcher:
    """Picks one of the replicas that may take new requests, arrival by arrival.

    The caller passes only those (a draining replica is never offered), each by its count
    of unfinished requests: the scheduler's, as the server's load reads.
    """

    def __init__(self, policy: Dispatch, seed: int) -> None:
        self.policy = policy
        self._rng = child_rng(seed, _DISPATCH_STREAM)
        self._sent = 0

    def pick(self, unfinished: Sequence[int]) -> int:
        """The index in ``unfinished`` of the replica the next arrival goes to."""
        n = len(unfinished)
        if n == 0:
            raise ValueError("no replica takes new requests: dispatch needs at least one")
        if self.policy is Dispatch.LEAST_REQUESTS:
            return min(range(n), key=unfinished.__getitem__)  # ties: the first, as before
        if self.policy is Dispatch.ROUND_ROBIN:
            # Over the list as it is now, as the load generator reads its endpoints at
            # each send: a replica added or drained changes the cycle from the next pick.
            i = self._sent % n
            self._sent += 1
            return i
        return int(self._rng.integers(n))


def add_dispatch_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                          what: str) -> None:
    """``--dispatch``: override the scenario's policy for ``what`` (a run, each trial)."""
    parser.add_argument(
        "--dispatch", type=_dispatch_flag, default=None, metavar="|".join(DISPATCH_CHOICES),
        help=f"how {what} spreads arrivals over the replicas (default: the scenario's "
             "`dispatch:`, else random, as a Kubernetes Service's kube-proxy does; "
             "round_robin: kube-proxy's IPVS mode; least_requests: a load-aware router)")


def _dispatch_flag(value: str) -> Dispatch:
    try:
        return parse_dispatch(value)
    except ValueError as e:
        # argparse names the flag itself: "argument --dispatch: rr: unknown ...".
        raise argparse.ArgumentTypeError(f"{value}: {e}") from None
