"""``spec.connections``: how long the pods' server keeps a client's connection waiting,
as ``slopilot serve``'s deadline flags set it (``engine/http_deadlines.py``), and the
meter's in front of vLLM: the server the clients, and their proxies, connect to.

    connections:
      keepAlive: 75s   # an idle connection kept for its next request (default 5s)
      send: 60s        # a client taking no byte of its answer (0s: no limit)
      head: 30s        # a request's head
      bodyIdle: 30s    # a silence inside a request's body
      maxConnections: 2000  # connections held for clients at once (default: from ulimit -n)

The one a deployment most often needs is ``keepAlive``: whatever keeps idle connections
to the pods longer than their server does (a mesh's sidecar, an ingress, a client pool)
races its close, and the request it sends as the server closes is lost (a 502/503, a
connection error). A field left out keeps the server's default, and no flag is rendered
for it; a change rolls the pods (the flags are on their command line).

``maxConnections`` (``--max-connections``, engine/connection_cap.py): past it a request
is a 503 with Retry-After, while the probes and the scrape still answer. The server's
default is half its ``ulimit -n`` (a quarter for the meter: two descriptors a
connection), at most 1024; a pod whose runtime gives it 1024 descriptors holds 512 (256
through the meter), fewer than a vLLM tuned to 1,024 sequences may run at once. The
bounds here are the flag's; a value above what the pod's ``ulimit -n`` holds is refused
by the server at start, its log naming the most it can hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slopilot.engine.deadline_flags import DEADLINE_FLAGS, MAX_CONNECTIONS_FLAG
from slopilot.engine.http_deadlines import DeadlineError, Deadlines
from slopilot.operator.spec_reader import SpecReader


@dataclass(frozen=True, slots=True)
class ConnectionField:
    """One field of ``spec.connections``: the ``Deadlines`` field it sets and its range."""

    deadline: str
    lo_s: float
    hi_s: float
    description: str


FIELDS: Mapping[str, ConnectionField] = MappingProxyType({
    "keepAlive": ConnectionField(
        "keep_alive_s", 1.0, 3600.0, "How long an idle connection is kept for its next "
        "request (default 5s, vLLM's). Set it above the idle timeout of whatever keeps "
        "connections to the pods (a mesh's sidecar, an ingress), or a request sent as the "
        "server closes is lost."),
    "send": ConnectionField(
        "send_s", 0.0, 3600.0, "How long a client may take no byte of the answer held for "
        "it before it is dropped and its request aborted (default 60s; 0s: no limit)."),
    "head": ConnectionField(
        "head_s", 1.0, 600.0, "How long a request's head may take (default 30s)."),
    "bodyIdle": ConnectionField(
        "body_idle_s", 1.0, 600.0, "How long a request's body may send nothing while the "
        "server waits for it (default 30s)."),
})


MAX_CONNECTIONS = "maxConnections"
MAX_CONNECTIONS_KEY = "max_connections"
"""``maxConnections``' key in ``parse_connections``' mapping, beside the deadlines'."""
MAX_CONNECTIONS_RANGE = (1, 65536)
MAX_CONNECTIONS_DESCRIPTION = (
    "Connections the pods' server (the meter's, in front of vLLM) holds for clients at "
    "once; past it a request is answered 503 with Retry-After while /health and /metrics "
    "still answer. Default: half the container's open-file limit (a quarter through the "
    "meter), at most 1024. Above what that limit holds, the server refuses to start, "
    "naming the most it can hold.")


def parse_connections(spec: Mapping[str, object], r: SpecReader) -> Mapping[str, float]:
    """The deadlines ``spec.connections`` gives, in seconds by ``Deadlines`` field, and
    its ``maxConnections`` (``MAX_CONNECTIONS_KEY``), only those given; a problem appended
    for each out of its range, naming field, value and range."""
    given: dict[str, float] = {}
    for camel, f in FIELDS.items():
        where = f"spec.connections.{camel}"
        if (got := r.duration(spec, where)) is None:
            continue
        text, seconds = got
        if not f.lo_s <= seconds <= f.hi_s:
            r.problems.append(f"{where}={text!r}: use {f.lo_s:g}s to {f.hi_s:g}s")
            continue
        given[f.deadline] = seconds
    try:  # the engine's own bounds, so the pods never refuse what was admitted
        Deadlines(**given)
    except DeadlineError as exc:
        camel = next(c for c, f in FIELDS.items() if f.deadline == exc.field)
        r.problems.append(f"spec.connections.{camel}: {exc.expected}")
        return {}
    where = f"spec.connections.{MAX_CONNECTIONS}"
    most = r.get(spec, where, int)
    if most is not None:
        lo, hi = MAX_CONNECTIONS_RANGE
        if lo <= most <= hi:
            given[MAX_CONNECTIONS_KEY] = most
        else:
            r.problems.append(f"{where}={most}: use {lo} to {hi} connections (leave it out "
                              "for the server's default, from the pod's open-file limit)")
    return MappingProxyType(given)


def connection_flags(given: Mapping[str, float]) -> list[str]:
    """The server's command-line flags for ``given`` (``parse_connections``' form)."""
    flags = {**DEADLINE_FLAGS, MAX_CONNECTIONS_KEY: MAX_CONNECTIONS_FLAG}
    return [arg for name, value in given.items()
            for arg in (flags[name], f"{int(value)}" if name == MAX_CONNECTIONS_KEY
                        else f"{value:g}")]
